#include "server/pooling_api.h"

#include <algorithm>
#include <bit>
#include <nlohmann/json.hpp>
#include <numeric>

#include "server/api_json.h"
#include "server/base64.h"

namespace vlm {
namespace {

using ojson = nlohmann::ordered_json;

using api_json::dump;
using api_json::listed;

// 400 for the first field the endpoint does not read; those vLLM has and vlm does not are named
// as unsupported (they would change the output) unless null (or, for priority, vLLM's default 0).
template <size_t N>
std::optional<ApiError> check_fields(const ojson& body, const std::string_view (&known)[N]) {
  static constexpr std::string_view kUnsupported[] = {
      "truncate_prompt_tokens", "add_special_tokens",   "priority",       "mm_processor_kwargs",
      "chat_template",          "chat_template_kwargs", "embed_dtype",    "endianness",
      "encoding_dtype",         "return_token_ids",     "score_template", "max_chunks_per_doc"};
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (listed(k, known) || k == "model" || k == "user" || k == "request_id") continue;
    if (it->is_null() || (k == "priority" && *it == 0)) continue;
    if (listed(k, kUnsupported))
      return bad_request("'" + k + "' is not supported by this server", k);
    return bad_request("unknown field '" + k + "'", k);
  }
  return std::nullopt;
}

std::optional<ApiError> read_common(const ojson& j, std::string* model, std::string* instruction) {
  for (auto [key, out] : {std::pair{"model", model}, std::pair{"instruction", instruction}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string()) return bad_request(std::string("'") + key + "' must be a string", key);
    *out = it->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> read_flag(const ojson& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad_request(std::string("'") + key + "' must be a boolean", key);
  *out = it->get<bool>();
  return std::nullopt;
}

// vLLM's use_activation, or one of its older names (`names`, the first the current one); two
// that disagree are a 400.
template <size_t N>
std::optional<ApiError> read_activation(const ojson& j, const char* const (&names)[N], bool* out) {
  std::optional<bool> seen;
  const char* first = nullptr;
  for (const char* k : names) {
    bool v = true;
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) continue;
    if (auto e = read_flag(j, k, &v)) return e;
    if (seen && *seen != v) {
      return bad_request(std::string("'") + k + "' and '" + first + "' disagree", k);
    }
    seen = v;
    first = k;
  }
  if (seen) *out = *seen;
  return std::nullopt;
}

// A list of token ids, each in [0, vocab).
std::optional<ApiError> read_ids(const ojson& list, int64_t vocab, const std::string& param,
                                 std::vector<int32_t>* out) {
  if (list.empty()) return bad_request("a list of token ids must not be empty", param);
  for (size_t i = 0; i < list.size(); ++i) {
    const ojson& v = list[i];
    const std::string at = param + "[" + std::to_string(i) + "]";
    if (!v.is_number_integer()) return bad_request("token ids must be integers", at);
    const auto id = v.get<int64_t>();
    if (id < 0 || id >= vocab) {
      return bad_request("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(vocab) + ")",
                         at);
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

// OpenAI's `input`: a string, a list of strings, a list of token ids, or a list of such lists.
std::optional<ApiError> read_input(const ojson& in, int64_t vocab, std::vector<PoolingItem>* out) {
  auto text = [](std::string s) {
    PoolingItem p;
    p.text = std::move(s);
    return p;
  };
  if (in.is_string()) {
    out->push_back(text(in.get<std::string>()));
    return std::nullopt;
  }
  if (!in.is_array()) {
    return bad_request("'input' must be a string, a list of strings, or token ids", "input");
  }
  if (in.empty()) return bad_request("'input' must not be empty", "input");
  if (in.size() > kMaxPoolingInputs) {
    return bad_request("'input' has " + std::to_string(in.size()) + " entries; at most " +
                           std::to_string(kMaxPoolingInputs) + " in one request",
                       "input");
  }
  if (in[0].is_number()) {  // one prompt's token ids
    PoolingItem p;
    p.kind = PoolingItem::Kind::kTokens;
    if (auto e = read_ids(in, vocab, "input", &p.ids)) return e;
    out->push_back(std::move(p));
    return std::nullopt;
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string at = "input[" + std::to_string(i) + "]";
    if (in[i].is_string()) {
      out->push_back(text(in[i].get<std::string>()));
    } else if (in[i].is_array()) {
      PoolingItem p;
      p.kind = PoolingItem::Kind::kTokens;
      if (auto e = read_ids(in[i], vocab, at, &p.ids)) return e;
      out->push_back(std::move(p));
    } else {
      return bad_request("each input must be a string or a list of token ids", at);
    }
  }
  return std::nullopt;
}

PoolingItem parts_item(const ojson& parts, std::string param) {
  PoolingItem p;
  p.kind = PoolingItem::Kind::kParts;
  p.parts_json = dump(parts);
  p.param = std::move(param);
  return p;
}

// vLLM's score inputs: a string; {"content": [parts]}, each part an input of its own; or a list
// whose entries are strings or {"content": [parts]} (then one input of all those parts).
// `documents`, when given, receives each input's echo for a rerank reply.
std::optional<ApiError> read_score_inputs(const ojson& v, const std::string& param, bool allow_list,
                                          std::vector<PoolingItem>* out,
                                          std::vector<std::string>* documents) {
  auto content_of = [](const ojson& obj, const std::string& at,
                       const ojson** parts) -> std::optional<ApiError> {
    auto c = obj.find("content");
    if (obj.size() != 1 || c == obj.end() || !c->is_array()) {
      return bad_request("a multimodal input is {\"content\": [parts]}", at);
    }
    if (c->empty()) return bad_request("'content' must not be empty", at + ".content");
    *parts = &*c;
    return std::nullopt;
  };
  auto add_text = [&](const std::string& s) {
    PoolingItem p;
    p.text = s;
    out->push_back(std::move(p));
    if (documents) documents->push_back(dump(ojson{{"text", s}}));
  };
  auto add_parts = [&](const ojson& parts, const std::string& at, bool single = false) {
    out->push_back(parts_item(parts, at));
    out->back().single_part = single;
    if (documents) documents->push_back(dump(ojson{{"multi_modal", parts}}));
  };
  if (v.is_string()) {
    add_text(v.get<std::string>());
  } else if (v.is_object()) {
    const ojson* parts = nullptr;
    if (auto e = content_of(v, param, &parts)) return e;
    if (!allow_list) {
      add_parts(*parts, param + ".content");
      return std::nullopt;
    }
    for (size_t i = 0; i < parts->size(); ++i) {
      const std::string at = param + ".content[" + std::to_string(i) + "]";
      add_parts(ojson::array({(*parts)[i]}), at, true);
    }
  } else if (v.is_array() && allow_list) {
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string at = param + "[" + std::to_string(i) + "]";
      if (v[i].is_string()) {
        add_text(v[i].get<std::string>());
        continue;
      }
      const ojson* parts = nullptr;
      if (!v[i].is_object())
        return bad_request("each input must be a string or {\"content\": [parts]}", at);
      if (auto e = content_of(v[i], at, &parts)) return e;
      add_parts(*parts, at + ".content");
    }
  } else {
    return bad_request(
        std::string("'") + param + "' must be a string" +
            (allow_list ? ", a list, or {\"content\": [parts]}" : " or {\"content\": [parts]}"),
        param);
  }
  if (out->empty()) return bad_request(std::string("'") + param + "' must not be empty", param);
  if (out->size() > kMaxPoolingInputs) {
    return bad_request("'" + param + "' has " + std::to_string(out->size()) + " inputs; at most " +
                           std::to_string(kMaxPoolingInputs) + " in one request",
                       param);
  }
  return std::nullopt;
}

ojson usage_json(int64_t prompt_tokens) {
  return ojson{{"prompt_tokens", prompt_tokens},
               {"total_tokens", prompt_tokens},
               {"completion_tokens", 0},
               {"prompt_tokens_details", nullptr}};
}

// The score's activation: vLLM's use_activation and its older names.
constexpr const char* kActivation[] = {"use_activation", "softmax", "activation"};

}  // namespace

ApiResult<EmbeddingsRequest> parse_embeddings(std::string_view body, int64_t vocab) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  static constexpr std::string_view kKnown[] = {
      "input",       "messages",   "encoding_format", "dimensions",     "normalize",
      "instruction", "min_pixels", "max_pixels",      "use_activation", "activation"};
  if (auto e = check_fields(j, kKnown)) return *e;
  EmbeddingsRequest r;
  if (auto e = read_common(j, &r.model, &r.instruction)) return *e;
  static constexpr const char* kNormalize[] = {"use_activation", "normalize", "activation"};
  if (auto e = read_activation(j, kNormalize, &r.normalize)) return *e;
  if (auto f = j.find("encoding_format"); f != j.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) {
      return bad_request("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
    }
    r.base64 = *f == "base64";
  }
  if (auto d = j.find("dimensions"); d != j.end() && !d->is_null()) {
    if (!d->is_number_integer() || d->get<int64_t>() < 1) {
      return bad_request("'dimensions' must be a positive integer", "dimensions");
    }
    r.dimensions = d->get<int64_t>();
  }
  const bool has_input = j.contains("input"), has_messages = j.contains("messages");
  if (has_input && has_messages) {
    return bad_request("give either 'input' or 'messages', not both", "messages");
  }
  if (!has_input && !has_messages) {
    return bad_request("'input' (texts or token ids) or 'messages' (a chat) is required", "input");
  }
  if (has_input) {
    for (const char* k : {"min_pixels", "max_pixels"}) {
      if (j.contains(k)) return bad_request(std::string("'") + k + "' goes with 'messages'", k);
    }
    if (auto e = read_input(j["input"], vocab, &r.inputs)) return *e;
    return r;
  }
  if (!r.instruction.empty()) {
    return bad_request("with 'messages', the system message is the instruction", "instruction");
  }
  ojson chat = ojson::object();
  for (const char* k : {"model", "messages", "min_pixels", "max_pixels"}) {
    if (j.contains(k)) chat[k] = j[k];
  }
  r.chat_body = dump(chat);
  return r;
}

ApiResult<ScoreRequest> parse_score(std::string_view body) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  static constexpr std::string_view kKnown[] = {
      "queries", "documents",   "items",          "data_1",  "data_2",    "text_1",
      "text_2",  "instruction", "use_activation", "softmax", "activation"};
  if (auto e = check_fields(j, kKnown)) return *e;
  ScoreRequest r;
  if (auto e = read_common(j, &r.model, &r.instruction)) return *e;
  if (auto e = read_activation(j, kActivation, &r.use_activation)) return *e;
  static constexpr std::pair<const char*, const char*> kPairs[] = {
      {"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"}, {"text_1", "text_2"}};
  const std::pair<const char*, const char*>* pair = nullptr;
  for (const auto& p : kPairs) {
    if (j.contains(p.first) && j.contains(p.second)) {
      if (pair != nullptr) return bad_request("give one pair of inputs", p.second);
      pair = &p;
    }
  }
  if (pair == nullptr) {
    return bad_request(
        "give the two sides as 'queries' and 'documents' (or 'items'), 'data_1' and 'data_2', or "
        "'text_1' and 'text_2'",
        "");
  }
  for (const char* k : {"queries", "documents", "items", "data_1", "data_2", "text_1", "text_2"}) {
    if (j.contains(k) && k != std::string_view(pair->first) &&
        k != std::string_view(pair->second)) {
      return bad_request(std::string("'") + k + "' does not go with '" + pair->first + "'", k);
    }
  }
  r.documents_field = pair->second;
  if (auto e = read_score_inputs(j[pair->first], pair->first, true, &r.queries, nullptr)) return *e;
  if (auto e = read_score_inputs(j[pair->second], pair->second, true, &r.documents, nullptr)) {
    return *e;
  }
  if (r.queries.size() > 1 && r.queries.size() != r.documents.size()) {
    return bad_request("input lengths must be 1:1, 1:N or N:N; got " +
                           std::to_string(r.queries.size()) + ":" +
                           std::to_string(r.documents.size()),
                       pair->second);
  }
  return r;
}

ApiResult<ScoreRequest> parse_rerank(std::string_view body) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  static constexpr std::string_view kKnown[] = {"query",          "documents",       "top_n",
                                                "instruction",    "softmax",         "activation",
                                                "use_activation", "return_documents"};
  if (auto e = check_fields(j, kKnown)) return *e;
  ScoreRequest r;
  if (auto e = read_common(j, &r.model, &r.instruction)) return *e;
  if (auto e = read_activation(j, kActivation, &r.use_activation)) return *e;
  if (auto e = read_flag(j, "return_documents", &r.return_documents)) return *e;
  if (auto t = j.find("top_n"); t != j.end() && !t->is_null()) {
    if (!t->is_number_integer() || t->get<int64_t>() < 0) {
      return bad_request("'top_n' must be a non-negative integer", "top_n");
    }
    r.top_n = t->get<int64_t>();
  }
  if (!j.contains("query")) return bad_request("'query' is required", "query");
  if (!j.contains("documents")) return bad_request("'documents' is required", "documents");
  if (auto e = read_score_inputs(j["query"], "query", false, &r.queries, nullptr)) return *e;
  if (auto e =
          read_score_inputs(j["documents"], "documents", true, &r.documents, &r.document_json)) {
    return *e;
  }
  return r;
}

std::string embeddings_json(const PoolingReplyInfo& info,
                            const std::vector<std::vector<float>>& embeddings, bool base64) {
  ojson data = ojson::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    const std::vector<float>& e = embeddings[i];
    ojson item = {{"index", i}, {"object", "embedding"}};
    if (base64) {
      // float32 as numpy's tobytes() on a little-endian machine (the OpenAI client decodes it so).
      static_assert(std::endian::native == std::endian::little);
      item["embedding"] = base64_encode(
          std::string_view(reinterpret_cast<const char*>(e.data()), e.size() * sizeof(float)));
    } else {
      item["embedding"] = e;
    }
    data.push_back(std::move(item));
  }
  ojson out = {
      {"id", info.id},       {"object", "list"}, {"created", info.created},
      {"model", info.model}, {"data", data},     {"usage", usage_json(info.prompt_tokens)}};
  return dump(out);
}

std::string score_json(const PoolingReplyInfo& info, const std::vector<double>& scores) {
  ojson data = ojson::array();
  for (size_t i = 0; i < scores.size(); ++i) {
    data.push_back(ojson{{"index", i}, {"object", "score"}, {"score", scores[i]}});
  }
  ojson out = {
      {"id", info.id},       {"object", "list"}, {"created", info.created},
      {"model", info.model}, {"data", data},     {"usage", usage_json(info.prompt_tokens)}};
  return dump(out);
}

std::string rerank_json(const PoolingReplyInfo& info, const ScoreRequest& request,
                        const std::vector<double>& scores) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  if (request.top_n > 0 && static_cast<size_t>(request.top_n) < order.size()) {
    order.resize(static_cast<size_t>(request.top_n));
  }
  ojson results = ojson::array();
  for (size_t i : order) {
    ojson r = {{"index", i}};
    if (request.return_documents) r["document"] = ojson::parse(request.document_json[i]);
    r["relevance_score"] = scores[i];
    results.push_back(std::move(r));
  }
  ojson out = {
      {"id", info.id},
      {"model", info.model},
      {"usage", {{"prompt_tokens", info.prompt_tokens}, {"total_tokens", info.prompt_tokens}}},
      {"results", results}};
  return dump(out);
}

}  // namespace vlm
