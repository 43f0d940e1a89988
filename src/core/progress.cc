// vlm::ProgressStep: a long step's line, redrawn in place on a terminal, one line elsewhere.
#include "vlm/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "core/log_internal.h"
#include "vlm/log.h"

namespace vlm {
namespace {

constexpr int kBarWidth = 20;
constexpr int64_t kRedrawNs = 100'000'000;  // a terminal's line, ten times a second at most

// A terminal that takes "\r" and "ESC [K" (erase to the end of the line).
bool stderr_is_terminal() {
  if (::isatty(STDERR_FILENO) == 0) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

// The terminal's width in columns (0: unknown).
int terminal_columns() {
  winsize ws{};
  return ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 ? ws.ws_col : 0;
}

// "1 layer", "28 layers" (`unit` is plural).
std::string count_text(int64_t n, const std::string& unit) {
  std::string u = unit;
  if (n == 1 && !u.empty() && u.back() == 's') u.pop_back();
  return std::to_string(n) + " " + u;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

std::string human_bytes(int64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

ProgressStep::ProgressStep(std::string what, int64_t total, std::string unit)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(0, total)),
      t0_(std::chrono::steady_clock::now()) {
  quiet_ = !log_enabled(LogLevel::kInfo);
  live_ = !quiet_ && log_format() == LogFormat::kText && stderr_is_terminal();
  if (live_) draw(/*force=*/true);
}

ProgressStep::~ProgressStep() {
  if (!finished_.load() && live_) log_internal::end_live(this, "");  // failed: the error says why
}

void ProgressStep::advance(int64_t n) {
  done_ += n;
  if (live_ && !finished_.load()) draw(/*force=*/false);
}

void ProgressStep::draw(bool force) {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
          .count();
  int64_t last = last_draw_ns_.load();
  if (!force && (now - last < kRedrawNs || !last_draw_ns_.compare_exchange_strong(last, now))) {
    return;  // drawn a moment ago, or by another thread just now
  }
  if (force) last_draw_ns_ = now;
  std::string f = frame(/*final=*/false);
  // One row: a line that wrapped could not be redrawn in place.
  if (const int cols = terminal_columns(); cols > 1 && f.size() >= static_cast<size_t>(cols)) {
    f.resize(static_cast<size_t>(cols - 1));
  }
  log_internal::draw_live(this, f);
}

std::string ProgressStep::frame(bool final) const {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const int64_t done = std::min(done_.load(), total_ > 0 ? total_ : done_.load());
  const bool bytes = unit_ == "bytes";
  std::string out = "vlm: " + what_;
  if (final) {  // "...: 28 layers in 7.9 s" / "...: 4.1 GiB in 4.8 s (850.0 MiB/s)"
    out +=
        ": " + (bytes ? human_bytes(done) : count_text(done, unit_)) + " in " + seconds_text(secs);
    if (bytes && secs > 0.05) {
      out += " (" + human_bytes(static_cast<int64_t>(static_cast<double>(done) / secs)) + "/s)";
    }
    return out;
  }
  const int filled = total_ > 0 ? static_cast<int>(kBarWidth * done / total_) : 0;
  out += " [" + std::string(filled, '#') + std::string(kBarWidth - filled, ' ') + "] ";
  out += bytes ? human_bytes(done) + " / " + human_bytes(total_)
               : std::to_string(done) + "/" + std::to_string(total_) + " " + unit_;
  if (bytes && secs > 0.2) {
    out += ", " + human_bytes(static_cast<int64_t>(static_cast<double>(done) / secs)) + "/s";
  }
  return out + ", " + seconds_text(secs);
}

void ProgressStep::finish() {
  if (finished_.exchange(true)) return;
  if (quiet_) return;
  if (live_) {
    log_internal::end_live(this, frame(/*final=*/true) + "\n");
    return;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (log_format() == LogFormat::kJson) {
    char s[32];
    std::snprintf(s, sizeof s, "%.3f", secs);
    const int64_t done = total_ > 0 ? std::min(done_.load(), total_) : done_.load();
    log(LogLevel::kInfo, what_,
        {{"done", std::to_string(done), true},
         {"total", std::to_string(total_), true},
         {"unit", unit_},
         {"seconds", s, true}});
    return;
  }
  log(LogLevel::kInfo, frame(/*final=*/true).substr(5));  // vlm::log says "vlm: " itself
}

}  // namespace vlm
