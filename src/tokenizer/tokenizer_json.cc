#include "tokenizer/tokenizer_json.h"

namespace vlm::tok {
namespace {

using json = nlohmann::json;

// A SAX handler that builds a DOM like nlohmann's own, except for the two big tables inside the
// top-level "model" object, which it diverts into TokenizerJson's vectors.
class Handler {
 public:
  explicit Handler(TokenizerJson* out) : out_(out) {}

  const std::string& error() const { return error_; }

  bool null() { return value(json(nullptr)); }
  bool boolean(bool v) { return value(json(v)); }
  bool number_integer(json::number_integer_t v) {
    if (mode_ == Mode::kVocab) return vocab_entry(v);
    return value(json(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::kVocab) {
      if (v > static_cast<json::number_unsigned_t>(INT64_MAX)) return vocab_error();
      return vocab_entry(static_cast<int64_t>(v));
    }
    return value(json(v));
  }
  bool number_float(json::number_float_t v, const std::string&) { return value(json(v)); }
  bool binary(json::binary_t& v) { return value(json(std::move(v))); }

  bool string(std::string& s) {
    switch (mode_) {
      case Mode::kMerges: {
        // Older files write a merge as "left right"; byte-level tokens never contain a plain
        // space, so exactly one space must separate the two.
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return merge_error("expected \"left right\", got \"" + s + "\"");
        }
        out_->merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_size_ == 0) pair_[0] = std::move(s);
        if (pair_size_ == 1) pair_[1] = std::move(s);
        ++pair_size_;
        return true;
      case Mode::kVocab:
        return vocab_error();
      case Mode::kDom:
        break;
    }
    return value(json(std::move(s)));
  }

  bool key(std::string& k) {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }

  bool start_object(size_t) {
    if (mode_ == Mode::kVocab) return vocab_error();
    if (mode_ != Mode::kDom) return merge_error("expected a [left, right] pair");
    if (in_model() && key_ == "vocab") {
      mode_ = Mode::kVocab;
      out_->has_vocab = true;
      out_->vocab.reserve(1 << 18);
      return true;
    }
    const bool is_model = stack_.size() == 1 && key_ == "model";
    json* node = add(json::object());
    stack_.push_back({node, is_model});
    return true;
  }

  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool start_array(size_t) {
    switch (mode_) {
      case Mode::kVocab:
        return vocab_error();
      case Mode::kMerges:
        mode_ = Mode::kMergePair;
        pair_size_ = 0;
        return true;
      case Mode::kMergePair:
        return merge_error("expected a [left, right] pair of strings");
      case Mode::kDom:
        break;
    }
    if (in_model() && key_ == "merges") {
      mode_ = Mode::kMerges;
      out_->has_merges = true;
      out_->merges.reserve(1 << 18);
      return true;
    }
    json* node = add(json::array());
    stack_.push_back({node, false});
    return true;
  }

  bool end_array() {
    switch (mode_) {
      case Mode::kMergePair:
        if (pair_size_ != 2) return merge_error("expected a [left, right] pair of strings");
        out_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        mode_ = Mode::kMerges;
        return true;
      case Mode::kMerges:
        mode_ = Mode::kDom;
        return true;
      default:
        stack_.pop_back();
        return true;
    }
  }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = std::string("invalid JSON: ") + e.what();
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };
  struct Frame {
    json* node;
    bool is_model;  // the top-level "model" object, where vocab and merges live
  };

  bool in_model() const { return !stack_.empty() && stack_.back().is_model; }

  bool value(json&& v) {
    if (mode_ == Mode::kVocab) return vocab_error();
    if (mode_ != Mode::kDom) return merge_error("expected a string");
    add(std::move(v));
    return true;
  }

  // Adds `v` to the innermost open container (or makes it the root). Only that container is
  // modified, so the pointers to its ancestors on the stack stay valid.
  json* add(json&& v) {
    if (stack_.empty()) {
      out_->root = std::move(v);
      return &out_->root;
    }
    json& parent = *stack_.back().node;
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }

  bool vocab_entry(int64_t id) {
    out_->vocab.emplace_back(std::move(vocab_key_), id);
    return true;
  }
  bool vocab_error() {
    error_ = "model.vocab entry '" + vocab_key_ + "' is not an integer id";
    return false;
  }
  bool merge_error(const std::string& what) {
    error_ = "model.merges[" + std::to_string(out_->merges.size()) + "]: " + what;
    return false;
  }

  TokenizerJson* out_;
  std::vector<Frame> stack_;
  std::string key_;
  std::string vocab_key_;
  Mode mode_ = Mode::kDom;
  std::string pair_[2];
  int pair_size_ = 0;
  std::string error_;
};

}  // namespace

Status parse_tokenizer_json(std::string_view text, TokenizerJson* out) {
  Handler handler(out);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &handler);
  } catch (const std::exception& e) {
    // Only allocation failure or a bug can get here; the handler itself does not throw on input.
    return data_loss(std::string("reading JSON: ") + e.what());
  }
  if (!ok) return data_loss(handler.error().empty() ? "invalid JSON" : handler.error());
  return ok_status();
}

}  // namespace vlm::tok
