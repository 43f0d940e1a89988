// Builds Tokenizer::Impl from a Hugging Face tokenizer.json (+ optional tokenizer_config.json).
// Only the pieces a byte-level BPE tokenizer like Qwen's uses are supported; anything else is
// reported as unimplemented rather than silently tokenizing differently.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace vlm::tok {
namespace {

using json = nlohmann::json;
using Impl = TokenizerImpl;

// GPT-2's split pattern, used by a ByteLevel pre-tokenizer with use_regex = true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status read_file(const std::string& path, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return not_found(path + ": cannot open file");
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) out->reserve(size);
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return data_loss(path + ": read error");
  return ok_status();
}

Status parse_json(const std::string& path, json* out) {
  std::string text;
  VLM_RETURN_IF_ERROR(read_file(path, &text));
  // Parse without exceptions first; the throwing parse runs only to produce a message.
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    try {
      json discarded = json::parse(text);  // throws, with the position and reason
    } catch (const json::exception& e) {
      return data_loss(path + ": invalid JSON: " + e.what());
    }
    return data_loss(path + ": invalid JSON");
  }
  return ok_status();
}

// The bytes a token string stands for, by the ByteLevel decoder's rule: map every character back
// through the byte-level alphabet, or, if any character is outside it, take the UTF-8 as is.
std::string byte_level_to_bytes(const std::string& token) {
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const uint32_t cp = utf8_next(token, &pos);
    const int b = cp == 0xFFFFFFFFu ? -1 : unicode_to_byte(cp);
    if (b < 0) return token;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

// `text` gathers each id's string while loading (vocab, then added tokens); finish_tables packs
// it into the tokenizer's tables.
Status load_vocab(const TokenizerJson& doc, Impl* im, std::vector<std::string>* text) {
  if (!doc.has_vocab) return data_loss("model has no \"vocab\" object");
  int64_t max_id = -1;
  for (const auto& [token, id] : doc.vocab) {
    if (id < 0 || id >= (int64_t{1} << 30)) {
      return data_loss("vocab entry '" + token + "' has id " + std::to_string(id) +
                       ", out of range");
    }
    max_id = std::max(max_id, id);
  }
  text->resize(max_id + 1);
  im->kind.assign(max_id + 1, Impl::kNone);
  im->vocab_to_id.reserve(doc.vocab.size());
  for (const auto& [token, id] : doc.vocab) {
    if (im->kind[id] != Impl::kNone) {
      return data_loss("vocab id " + std::to_string(id) + " is used twice");
    }
    (*text)[id] = token;
    im->kind[id] = Impl::kVocab;
    im->vocab_to_id.insert(token, static_cast<int32_t>(id));
  }
  return ok_status();
}

Status load_merges(const TokenizerJson& doc, Impl* im) {
  im->merges.reserve(doc.merges.size());
  std::string joined;
  int32_t rank = 0;
  for (const auto& [left, right] : doc.merges) {
    const std::string where = "model.merges[" + std::to_string(rank) + "]";
    const std::optional<int32_t> l = im->vocab_to_id.find(left);
    const std::optional<int32_t> r = im->vocab_to_id.find(right);
    if (!l || !r) {
      return data_loss(where + ": token '" + (l ? right : left) + "' is not in the vocab");
    }
    joined = left;
    joined += right;
    const std::optional<int32_t> j = im->vocab_to_id.find(joined);
    if (!j) return data_loss(where + ": merged token '" + joined + "' is not in the vocab");
    im->merges.insert(*l, *r, rank, *j);
    ++rank;
  }
  return ok_status();
}

Status load_added_tokens(const json& root, Impl* im, std::vector<std::string>* text) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return ok_status();
  if (!it->is_array()) return data_loss("\"added_tokens\" is not an array");
  for (const json& t : *it) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string()) {
      return data_loss("added token without an integer \"id\" and a string \"content\"");
    }
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 30)) {
      return data_loss("added token id " + std::to_string(id) + " out of range");
    }
    Impl::AddedToken a{t["content"].get<std::string>(), static_cast<int32_t>(id),
                       t.value("special", false)};
    // lstrip/rstrip/single_word/normalized are not implemented; Qwen sets them all false.
    if (static_cast<size_t>(id) >= text->size()) {
      text->resize(id + 1);
      im->kind.resize(id + 1, Impl::kNone);
    }
    // An added token may reuse a vocab id; it then wins for that id (as in the Rust library).
    (*text)[id] = a.content;
    im->kind[id] = a.special ? Impl::kSpecial : Impl::kAdded;
    im->added_to_id[a.content] = a.id;
    im->added.push_back(std::move(a));
  }
  for (size_t i = 0; i < im->added.size(); ++i) {
    const std::string& c = im->added[i].content;
    if (c.empty()) continue;  // matches nothing
    im->added_by_first_byte[static_cast<unsigned char>(c[0])].push_back(static_cast<int32_t>(i));
  }
  for (auto& list : im->added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return im->added[a].content.size() > im->added[b].content.size();
    });
  }
  return ok_status();
}

Status load_normalizer(const json& root, Impl* im) {
  auto it = root.find("normalizer");
  if (it == root.end() || it->is_null()) return ok_status();
  const std::string type = it->value("type", "");
  if (type == "NFC") {
    im->nfc_normalize = true;
    (void)nfc_is_inert(0);  // builds the quick-check table now (~15 ms) rather than in encode
    return ok_status();
  }
  return unimplemented("normalizer \"" + type + "\" is not supported (only NFC or none)");
}

Status load_pre_tokenizer(const json& root, Impl* im) {
  auto it = root.find("pre_tokenizer");
  if (it == root.end() || it->is_null()) {
    return unimplemented("no pre_tokenizer: only byte-level BPE is supported");
  }
  std::vector<const json*> steps;
  if (it->value("type", "") == "Sequence") {
    auto list = it->find("pretokenizers");
    if (list == it->end() || !list->is_array()) {
      return data_loss("Sequence pre_tokenizer without \"pretokenizers\"");
    }
    for (const json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(&*it);
  }
  std::string pattern;
  bool byte_level = false;
  for (const json* s : steps) {
    const std::string type = s->value("type", "");
    if (type == "Split") {
      if (!pattern.empty()) return unimplemented("more than one split pre-tokenizer");
      if (s->value("behavior", "") != "Isolated" || s->value("invert", false)) {
        return unimplemented("Split pre-tokenizer other than behavior Isolated, invert false");
      }
      auto p = s->find("pattern");
      if (p == s->end() || !p->is_object() || !p->contains("Regex") || !(*p)["Regex"].is_string()) {
        return unimplemented("Split pre-tokenizer without a \"Regex\" pattern");
      }
      pattern = (*p)["Regex"].get<std::string>();
    } else if (type == "ByteLevel") {
      if (s->value("add_prefix_space", false)) {
        return unimplemented("ByteLevel add_prefix_space = true");
      }
      if (s->value("use_regex", true)) {
        if (!pattern.empty()) return unimplemented("Split followed by ByteLevel use_regex");
        pattern = kGpt2Pattern;
      }
      byte_level = true;
    } else {
      return unimplemented("pre-tokenizer \"" + type + "\" is not supported");
    }
  }
  if (!byte_level) return unimplemented("pre_tokenizer has no ByteLevel step");
  if (!pattern.empty()) {
    Result<std::unique_ptr<SplitRegex>> re = SplitRegex::compile(pattern);
    if (!re.ok()) return re.status();
    im->split = std::move(re).value();
  }
  return ok_status();
}

Status load_model(const TokenizerJson& doc, Impl* im, std::vector<std::string>* text) {
  const json& root = doc.root;
  auto it = root.find("model");
  if (it == root.end() || !it->is_object()) return data_loss("missing \"model\" object");
  const json& model = *it;
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") return unimplemented("model type \"" + type + "\" is not BPE");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto k = model.find(key);
    if (k != model.end() && k->is_string() && !k->get_ref<const std::string&>().empty()) {
      return unimplemented(std::string("BPE ") + key + " is not supported");
    }
  }
  VLM_RETURN_IF_ERROR(load_vocab(doc, im, text));
  VLM_RETURN_IF_ERROR(load_merges(doc, im));
  return ok_status();
}

void finish_tables(const std::vector<std::string>& text, Impl* im) {
  size_t total = 0;
  for (const std::string& t : text) total += t.size();
  im->tokens.reserve(text.size(), total);
  im->bytes.reserve(text.size(), total);
  for (size_t id = 0; id < text.size(); ++id) {
    im->tokens.push_back(text[id]);
    im->bytes.push_back(im->kind[id] != Impl::kNone ? byte_level_to_bytes(text[id]) : "");
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append_codepoint(byte_to_unicode(static_cast<uint8_t>(b)), &ch);
    im->byte_ids[b] = im->vocab_to_id.find(ch).value_or(-1);
  }
}

std::optional<int32_t> special_token_id(const json& config, const char* key, const Impl& im) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  std::string content;
  if (it->is_string()) {
    content = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();
  } else {
    return std::nullopt;
  }
  if (auto a = im.added_to_id.find(content); a != im.added_to_id.end()) return a->second;
  return im.vocab_to_id.find(content);
}

Status load_config(const std::string& path, Impl* im) {
  json config;
  VLM_RETURN_IF_ERROR(parse_json(path, &config));
  if (!config.is_object()) return data_loss(path + ": not a JSON object");
  im->eos_id = special_token_id(config, "eos_token", *im);
  im->pad_id = special_token_id(config, "pad_token", *im);
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Impl>> parse_impl(const std::string& text, const std::string& name) {
  auto im = std::make_unique<Impl>();
  static std::atomic<uint64_t> next_uid{1};
  im->uid = next_uid.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> token_text;
  try {
    TokenizerJson doc;
    Status s = parse_tokenizer_json(text, &doc);
    if (s.ok() && !doc.root.is_object()) s = data_loss("not a JSON object");
    if (s.ok()) s = load_model(doc, im.get(), &token_text);
    if (s.ok()) s = load_added_tokens(doc.root, im.get(), &token_text);
    if (s.ok()) s = load_normalizer(doc.root, im.get());
    if (s.ok()) s = load_pre_tokenizer(doc.root, im.get());
    if (!s.ok()) return s.with_context(name);
  } catch (const std::exception& e) {
    // nlohmann throws type_error on a field of the wrong type; report it instead of escaping.
    return data_loss(name + ": " + e.what());
  }
  finish_tables(token_text, im.get());
  return im;
}

Result<std::unique_ptr<Impl>> load_impl(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file(path);
  if (fs::is_directory(file, ec)) file /= "tokenizer.json";
  const std::string file_name = file.string();
  std::string text;
  VLM_RETURN_IF_ERROR(read_file(file_name, &text));
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<Impl> im, parse_impl(text, file_name));
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config, ec)) {
    try {
      VLM_RETURN_IF_ERROR(load_config(config.string(), im.get()));
    } catch (const std::exception& e) {
      return data_loss(config.string() + ": " + e.what());
    }
  }
  return im;
}

}  // namespace vlm::tok
