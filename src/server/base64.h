// Strict RFC 4648 base64 (standard alphabet) for data: URLs in API requests.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/status.h"

namespace vlm {

// Decodes standard-alphabet base64 strictly: the length must be a multiple of
// 4, padding ('=') is required and may only end the input, the unused bits
// before padding must be zero, and any other character — whitespace included —
// is an error. Strictness keeps one image from having several encodings (the
// encoder cache keys images by their bytes) and turns client bugs into a 400
// instead of a silently corrupt image.
Result<std::vector<uint8_t>> base64_decode(std::string_view text);

// Bytes that base64_decode would produce for a well-formed input of this text
// (0 when the length is not a multiple of 4); lets callers enforce a size limit
// before allocating.
size_t base64_decoded_size(std::string_view text);

// Standard alphabet with padding (tests and clients build data: URLs with it).
std::string base64_encode(std::span<const uint8_t> bytes);
std::string base64_encode(std::string_view bytes);

}  // namespace vlm
