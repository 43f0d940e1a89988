// vlm::log: one process-wide level and format, lines written whole to stderr.
#include "vlm/log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>
#include <vector>

#include "core/log_internal.h"

namespace vlm {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
std::mutex g_write;
// The lines of the steps under way on a terminal (vlm::ProgressStep), oldest first: the last is
// drawn in place at the bottom of stderr, the others wait under it (a step within a step).
struct LiveLine {
  const void* owner;
  std::string frame;
};
std::vector<LiveLine> g_live;

// What is drawn at the bottom now ("" when no step is under way).
std::string live_frame() { return g_live.empty() ? std::string() : g_live.back().frame; }

// The length of the well-formed UTF-8 sequence at s[i] (1 to 4), or 0 when it is not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  if ((n == 2 && c < 0xC2) || (n == 3 && c == 0xE0 && b(i + 1) < 0xA0) ||
      (n == 3 && c == 0xED && b(i + 1) >= 0xA0) || (n == 4 && c == 0xF0 && b(i + 1) < 0x90) ||
      (n == 4 && (c > 0xF4 || (c == 0xF4 && b(i + 1) >= 0x90)))) {
    return 0;  // overlong, a surrogate, or past U+10FFFF
  }
  return n;
}

// A JSON string literal of `s`: quotes, backslashes and control characters escaped, bytes that
// are not UTF-8 written as U+FFFD (the line stays valid JSON whatever a client sent).
void json_string(std::string_view s, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_length(s, i);
    if (n == 0) {
      *out += "\\ufffd";
      ++i;
    } else if (n > 1) {
      out->append(s.substr(i, n));
      i += n;
    } else {
      if (c == '"' || c == '\\') {
        out->push_back('\\');
        out->push_back(static_cast<char>(c));
      } else if (c == '\n') {
        *out += "\\n";
      } else if (c < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        *out += buf;
      } else {
        out->push_back(static_cast<char>(c));
      }
      ++i;
    }
  }
  out->push_back('"');
}

// Text lines stay one line each: a line break inside becomes "\\n".
void text_piece(std::string_view s, std::string* out) {
  for (char c : s) {
    if (c == '\n') {
      *out += "\\n";
    } else if (c != '\r') {
      out->push_back(c);
    }
  }
}

}  // namespace

std::string log_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms));
  return buf;
}

Result<LogLevel> parse_log_level(std::string_view name) {
  for (LogLevel l : {LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo, LogLevel::kDebug}) {
    if (name == log_level_name(l)) return l;
  }
  return invalid_argument("log level '" + std::string(name) + "': error, warn, info or debug");
}

Result<LogFormat> parse_log_format(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return invalid_argument("log format '" + std::string(name) + "': text or json");
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
void set_log_format(LogFormat format) { g_format = static_cast<int>(format); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
LogFormat log_format() { return static_cast<LogFormat>(g_format.load()); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

void log(LogLevel level, std::string_view message, const std::vector<LogField>& fields) {
  if (!log_enabled(level)) return;
  std::string line;
  if (log_format() == LogFormat::kJson) {
    line = "{\"time\":\"" + log_timestamp() + "\",\"level\":\"" + log_level_name(level) +
           "\",\"msg\":";
    json_string(message, &line);
    for (const LogField& f : fields) {
      line.push_back(',');
      json_string(f.name, &line);
      line.push_back(':');
      if (f.number) {
        line += f.value;
      } else {
        json_string(f.value, &line);
      }
    }
    line += "}\n";
  } else {
    line = "vlm: ";
    if (level == LogLevel::kError) line += "error: ";
    if (level == LogLevel::kWarn) line += "warning: ";
    text_piece(message, &line);
    for (const LogField& f : fields) {
      line += " " + f.name + "=";
      text_piece(f.value, &line);
    }
    line.push_back('\n');
  }
  std::lock_guard<std::mutex> lock(g_write);
  if (!g_live.empty()) line = "\r\x1b[K" + line + live_frame();  // above the progress line
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

namespace log_internal {

void draw_live(const void* owner, std::string_view frame) {
  std::lock_guard<std::mutex> lock(g_write);
  auto it = std::find_if(g_live.begin(), g_live.end(),
                         [&](const LiveLine& l) { return l.owner == owner; });
  if (it == g_live.end()) it = g_live.insert(g_live.end(), LiveLine{owner, {}});
  it->frame.assign(frame);
  if (it + 1 != g_live.end()) return;  // a step within it is drawn now
  const std::string out = "\r\x1b[K" + it->frame;
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

void end_live(const void* owner, std::string_view last) {
  std::lock_guard<std::mutex> lock(g_write);
  auto it = std::find_if(g_live.begin(), g_live.end(),
                         [&](const LiveLine& l) { return l.owner == owner; });
  if (it == g_live.end() && last.empty()) return;
  if (it != g_live.end()) g_live.erase(it);
  // `last` in the line's place, and the step under way below it (an outer one drawn again).
  const std::string out = "\r\x1b[K" + std::string(last) + live_frame();
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

}  // namespace log_internal

void log_printf(LogLevel level, const char* format, ...) {
  if (!log_enabled(level)) return;
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string message(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(message.data(), message.size() + 1, format, again);
  va_end(again);
  log(level, message);
}

}  // namespace vlm
