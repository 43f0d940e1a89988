// vlm public API: what vlm says on stderr, and how. One process-wide level (error, warn, info,
// debug; default info) and format: text, one line "vlm: MESSAGE" (warnings "vlm: warning: ...",
// errors "vlm: error: ...", fields as key=value after the message), or JSON, one object a line
// ({"time": ISO 8601 UTC with milliseconds, "level", "msg", then the fields}).
// Thread-safety: any thread may log; each line is written whole.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vlm/status.h"

namespace vlm {

enum class LogLevel { kError, kWarn, kInfo, kDebug };
enum class LogFormat { kText, kJson };

// "error" | "warn" | "info" | "debug"; "text" | "json". InvalidArgument naming the accepted
// values otherwise.
Result<LogLevel> parse_log_level(std::string_view name);
Result<LogFormat> parse_log_format(std::string_view name);
const char* log_level_name(LogLevel level);

void set_log_level(LogLevel level);
void set_log_format(LogFormat format);
LogLevel log_level();
LogFormat log_format();
bool log_enabled(LogLevel level);
// Now, as the JSON lines' "time" says it: ISO 8601 UTC with milliseconds.
std::string log_timestamp();

// A field of a line: a name and its value, written as a JSON number when `number`.
struct LogField {
  std::string name;
  std::string value;
  bool number = false;
};

// Writes one line at `level` (nothing when the level is off).
void log(LogLevel level, std::string_view message, const std::vector<LogField>& fields = {});
// The same, the message formatted as printf formats it.
void log_printf(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace vlm
