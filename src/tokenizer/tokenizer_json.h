// Streaming reader for tokenizer.json. The vocab (150k entries) and merges (150k pairs) go straight
// into flat vectors; building them as a JSON DOM and tearing it down again took most of the load
// time. Everything else (a few kilobytes) is kept as an ordinary nlohmann::json document.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vlm/status.h"

namespace vlm::tok {

struct TokenizerJson {
  nlohmann::json root;  // the whole document except model.vocab and model.merges
  bool has_vocab = false;
  std::vector<std::pair<std::string, int64_t>> vocab;  // in file order
  bool has_merges = false;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

// Parses `text`. Errors (invalid JSON, a vocab entry that is not an integer, a malformed merge)
// are data_loss with the reason; the caller adds the file name.
Status parse_tokenizer_json(std::string_view text, TokenizerJson* out);

}  // namespace vlm::tok
