// vlm::log's stderr shared with vlm::ProgressStep: one line may be drawn in place at the bottom,
// and vlm::log's lines go above it.
#pragma once

#include <string_view>

namespace vlm::log_internal {

// Sets `owner`'s line to `frame` (no line break), drawn in place unless a line that began after
// it (a step within it) is under way.
void draw_live(const void* owner, std::string_view frame);
// Ends `owner`'s line: `last` (a whole line, or empty) written in its place, and the line of the
// step under way then, if any, drawn below it.
void end_live(const void* owner, std::string_view last);

}  // namespace vlm::log_internal
