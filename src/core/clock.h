// The steady clock the engine times its stages with, and intervals in milliseconds.
#pragma once

#include <chrono>
#include <cstdint>

namespace vlm {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline double ms_since(Clock::time_point t0) { return ms_between(t0, Clock::now()); }

// Now on the steady clock, in nanoseconds since its epoch (timestamps kept in atomics and
// streams).
inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace vlm
