// vlm::log's stderr shared with vlm::ProgressStep: one line may be drawn in place at the bottom,
// and vlm::log's lines go above it.
#pragma once

#include <string_view>

namespace vlm::log_internal {

// Draws `frame` (no line break) in place of the line now drawn, as `owner`'s.
void draw_live(const void* owner, std::string_view frame);
// Ends `owner`'s line: replaced by `last` (a whole line, or empty: erased). When another owner's
// line is drawn, `last` goes above that line.
void end_live(const void* owner, std::string_view last);

}  // namespace vlm::log_internal
