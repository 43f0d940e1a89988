// Small JSON helpers the API's parsers and writers share (nlohmann::ordered_json, so that what a
// client sent keeps its key order).
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace vlm::api_json {

using ojson = nlohmann::ordered_json;

// Compact JSON text; invalid UTF-8 (model text is checked upstream) is replaced, never thrown on.
inline std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

// Whether `key` is one of `list` (a request's known fields).
template <size_t N>
bool listed(std::string_view key, const std::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), key) != std::end(list);
}

}  // namespace vlm::api_json
