// The steady clock the engine times its stages with, and intervals in milliseconds.
#pragma once

#include <chrono>

namespace vlm {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double ms_since(Clock::time_point t0) { return ms_between(t0, Clock::now()); }

}  // namespace vlm
