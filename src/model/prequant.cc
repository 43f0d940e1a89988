#include "model/prequant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/half.h"

namespace vlm {
namespace {

using nlohmann::json;

// ------------------------------------------------------------------------------------------------
// config.json's quantization_config
// ------------------------------------------------------------------------------------------------

std::string value_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

Status refuse(const std::string& where, const std::string& field, const json& v,
              const std::string& why) {
  return invalid_argument(where + ": quantization_config." + field + " = " + value_text(v) + ": " +
                          why);
}

// A field that must be absent, null, false, empty or one of `allowed` (strings).
Status only(const json& j, const std::string& path, const char* key,
            std::initializer_list<const char*> allowed, const std::string& where,
            const std::string& why) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()) ||
      (it->is_object() && it->empty()) || (it->is_array() && it->empty())) {
    return ok_status();
  }
  if (it->is_string()) {
    for (const char* a : allowed) {
      if (it->get<std::string>() == a) return ok_status();
    }
  }
  return refuse(where, path + key, *it, why);
}

Status string_list(const json& j, const char* key, const std::string& path,
                   const std::string& where, std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_array()) return refuse(where, path + key, *it, "expected a list of names");
  for (const json& e : *it) {
    if (!e.is_string()) return refuse(where, path + key, *it, "expected a list of names");
    out->push_back(e.get<std::string>());
  }
  return ok_status();
}

// Whether `pattern` (a "re:" entry's, without the prefix) is a regular expression vlm reads
// (ECMAScript, which Python's simple patterns are).
bool regex_ok(const std::string& pattern) {
  try {
    std::regex r(pattern);
    return true;
  } catch (const std::regex_error&) {
    return false;
  }
}

// [rows, columns] as a list of two positive integers, or compressed-tensors' older "RxC" text.
bool block_shape(const json& b, int64_t* rows, int64_t* cols) {
  if (b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer()) {
    *rows = b[0].get<int64_t>();
    *cols = b[1].get<int64_t>();
  } else if (b.is_string()) {
    const std::string t = b.get<std::string>();
    const size_t x = t.find('x');
    if (x == std::string::npos) return false;
    try {
      *rows = std::stoll(t.substr(0, x));
      *cols = std::stoll(t.substr(x + 1));
    } catch (const std::exception&) {
      return false;
    }
  } else {
    return false;
  }
  return *rows > 0 && *cols > 0;
}

Result<PrequantConfig> parse_fp8(const json& q, const std::string& where) {
  PrequantConfig c;
  c.method = PrequantMethod::kFp8;
  VLM_RETURN_IF_ERROR(only(q, "", "fmt", {"e4m3"}, where, "vlm reads E4M3 FP8 weights only"));
  VLM_RETURN_IF_ERROR(only(q, "", "activation_scheme", {"dynamic"}, where,
                           "static activation scales are not supported (vlm quantizes "
                           "activations itself)"));
  auto bs = q.find("weight_block_size");
  if (bs == q.end() || !bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
      !(*bs)[1].is_number_integer() || (*bs)[0].get<int64_t>() <= 0 ||
      (*bs)[1].get<int64_t>() <= 0) {
    return refuse(where, "weight_block_size", bs == q.end() ? json() : *bs,
                  "expected [rows, columns] of the FP8 scale blocks (per-tensor FP8 without "
                  "blocks is not supported)");
  }
  PrequantScheme s;
  s.format = "float-quantized";
  s.targets = {"Linear"};
  s.bits = 8;
  s.is_float = true;
  s.strategy = "block";
  s.block_rows = (*bs)[0].get<int64_t>();
  s.block_cols = (*bs)[1].get<int64_t>();
  c.groups.push_back(s);
  VLM_RETURN_IF_ERROR(string_list(q, "modules_to_not_convert", "", where, &c.ignore));
  VLM_RETURN_IF_ERROR(string_list(q, "ignored_layers", "", where, &c.ignore));
  return c;
}

// One compressed-tensors config group's weights (`p`: its path for messages).
Result<PrequantScheme> parse_scheme(const json& g, const std::string& top_format,
                                    const std::string& p, const std::string& where) {
  PrequantScheme s;
  s.format = top_format;
  if (auto f = g.find("format"); f != g.end() && f->is_string()) s.format = f->get<std::string>();
  if (s.format != "pack-quantized" && s.format != "int-quantized" &&
      s.format != "naive-quantized" && s.format != "float-quantized") {
    return refuse(where, p + "format", json(s.format),
                  "vlm reads pack-quantized, int-quantized, naive-quantized and float-quantized");
  }
  VLM_RETURN_IF_ERROR(string_list(g, "targets", p, where, &s.targets));
  for (const std::string& t : s.targets) {
    if (t != "Linear" && t.rfind("re:", 0) != 0) {
      return refuse(where, p + "targets", json(t),
                    "vlm matches the target Linear and re: patterns only");
    }
    if (t != "Linear" && !regex_ok(t.substr(3))) {
      return refuse(where, p + "targets", json(t), "not a regular expression vlm can read");
    }
  }
  for (const char* key : {"input_activations", "output_activations"}) {
    auto a = g.find(key);
    if (a == g.end() || a->is_null()) continue;
    const bool dynamic = a->is_object() && a->value("dynamic", json(false)) == json(true);
    if (std::string(key) == "output_activations" || !dynamic) {
      return refuse(where, p + key, *a,
                    "static activation quantization is not supported (vlm quantizes activations "
                    "itself; dynamic input activations are run so)");
    }
  }
  auto w = g.find("weights");
  if (w == g.end() || !w->is_object()) {
    return refuse(where, p + "weights", w == g.end() ? json() : *w, "expected the weights' scheme");
  }
  const std::string wp = p + "weights.";
  s.bits = w->value("num_bits", 0);
  const std::string type = w->value("type", std::string("int"));
  s.is_float = type == "float";
  s.symmetric = w->value("symmetric", true);
  s.strategy = w->value("strategy", std::string("tensor"));
  if (type != "int" && type != "float") {
    return refuse(where, wp + "type", (*w)["type"], "expected int or float");
  }
  if (s.is_float ? s.bits != 8 : (s.bits != 4 && s.bits != 8)) {
    return refuse(where, wp + "num_bits", json(s.bits),
                  s.is_float ? "vlm reads 8-bit (E4M3) float weights"
                             : "vlm reads 4- and 8-bit integer weights");
  }
  // (naive-quantized holds either: llm-compressor writes FP8 weight-only schemes so.)
  if ((s.format == "float-quantized" && !s.is_float) ||
      ((s.format == "int-quantized" || s.format == "pack-quantized") && s.is_float)) {
    return refuse(where, p + "format", json(s.format), "does not match weights.type " + type);
  }
  if (s.is_float && !s.symmetric) {
    return refuse(where, wp + "symmetric", json(false), "FP8 weights have no zero points");
  }
  if (s.bits == 8 && !s.is_float && !s.symmetric) {
    return refuse(where, wp + "symmetric", json(false),
                  "8-bit integer weights with zero points are not supported");
  }
  VLM_RETURN_IF_ERROR(only(*w, wp, "dynamic", {}, where, "dynamic weight scales"));
  // (static / weight: the groups reordered before quantizing, the file as without; group, or its
  // alias dynamic: the activation order's groups, a weight_g_idx per column.)
  VLM_RETURN_IF_ERROR(only(*w, wp, "actorder", {"static", "weight", "group", "dynamic"}, where,
                           "expected static, weight, group or dynamic"));
  s.desc_act = w->value("actorder", json()) == json("group") ||
               w->value("actorder", json()) == json("dynamic");
  if (s.strategy == "group") {
    auto gs = w->find("group_size");
    if (gs == w->end() || !gs->is_number_integer() || gs->get<int64_t>() <= 0) {
      return refuse(where, wp + "group_size", gs == w->end() ? json() : *gs,
                    "expected a positive size");
    }
    s.group_size = gs->get<int64_t>();
    if (s.bits == 8 && !s.is_float) {
      return refuse(where, wp + "strategy", json(s.strategy),
                    "8-bit integer weights are read with channel or tensor scales");
    }
  } else if (s.strategy == "block") {
    auto b = w->find("block_structure");
    if (b == w->end() || !block_shape(*b, &s.block_rows, &s.block_cols)) {
      return refuse(where, wp + "block_structure", b == w->end() ? json() : *b,
                    "expected [rows, columns]");
    }
  } else if (s.strategy != "tensor" && s.strategy != "channel") {
    return refuse(where, wp + "strategy", json(s.strategy),
                  "vlm reads tensor, channel, group and block scales");
  }
  if (s.strategy == "block" && !s.is_float) {
    return refuse(where, wp + "strategy", json(s.strategy), "block scales are read for FP8 only");
  }
  return s;
}

Result<PrequantConfig> parse_compressed_tensors(const json& q, const std::string& where) {
  PrequantConfig c;
  c.method = PrequantMethod::kCompressedTensors;
  VLM_RETURN_IF_ERROR(only(q, "", "quantization_status", {"compressed"}, where,
                           "vlm reads compressed checkpoints (quantization_status compressed)"));
  if (auto sp = q.find("sparsity_config");
      sp == q.end() || !sp->is_object() || sp->value("format", json()) != json("dense")) {
    VLM_RETURN_IF_ERROR(
        only(q, "", "sparsity_config", {}, where, "sparse weights are not supported"));
  }
  VLM_RETURN_IF_ERROR(
      only(q, "", "transform_config", {}, where, "weight transforms are not supported"));
  VLM_RETURN_IF_ERROR(only(q, "", "kv_cache_scheme", {}, where,
                           "a quantized KV cache with stored scales is not supported"));
  const std::string top = q.value("format", std::string());
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    return refuse(where, "config_groups", groups == q.end() ? json() : *groups,
                  "expected at least one config group");
  }
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    if (!it->is_object()) return refuse(where, "config_groups." + it.key(), *it, "not an object");
    VLM_ASSIGN_OR_RETURN(PrequantScheme s,
                         parse_scheme(*it, top, "config_groups." + it.key() + ".", where));
    c.groups.push_back(std::move(s));
  }
  VLM_RETURN_IF_ERROR(string_list(q, "ignore", "", where, &c.ignore));
  for (const std::string& e : c.ignore) {
    if (e.rfind("re:", 0) == 0 && !regex_ok(e.substr(3))) {
      return refuse(where, "ignore", json(e), "not a regular expression vlm can read");
    }
  }
  return c;
}

// A boolean field (absent: `dflt`).
Result<bool> flag(const json& j, const char* key, bool dflt, const std::string& path,
                  const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) return refuse(where, path + key, *it, "expected true or false");
  return it->get<bool>();
}

// What a GPTQ / AWQ config leaves out: 4-bit groups of 128 over every Linear.
PrequantScheme packed_defaults(const char* format, bool symmetric) {
  PrequantScheme s;
  s.format = format;
  s.targets = {"Linear"};
  s.bits = 4;
  s.strategy = "group";
  s.group_size = 128;
  s.symmetric = symmetric;
  return s;
}

// A GPTQ / AWQ scheme from `j` (the config, or a dynamic entry over `base`).
Result<PrequantScheme> packed_scheme(const json& j, PrequantScheme s, bool awq,
                                     const std::string& path, const std::string& where) {
  if (auto b = j.find("bits"); b != j.end()) {
    if (!b->is_number_integer()) return refuse(where, path + "bits", *b, "expected 4 or 8");
    s.bits = b->get<int64_t>();
  }
  if (awq ? s.bits != 4 : (s.bits != 4 && s.bits != 8)) {
    return refuse(where, path + "bits", json(s.bits),
                  awq ? "vlm reads 4-bit AWQ weights" : "vlm reads 4- and 8-bit GPTQ weights");
  }
  if (auto g = j.find("group_size"); g != j.end()) {
    if (!g->is_number_integer() || (g->get<int64_t>() <= 0 && g->get<int64_t>() != -1) ||
        g->get<int64_t>() > (int64_t{1} << 31) || (awq && g->get<int64_t>() == -1)) {
      return refuse(where, path + "group_size", *g,
                    awq ? "expected a positive size" : "expected a positive size or -1 (per row)");
    }
    const int64_t g_size = g->get<int64_t>();
    s.strategy = g_size == -1 ? "channel" : "group";
    s.group_size = g_size == -1 ? 0 : g_size;
  }
  if (awq) {
    VLM_ASSIGN_OR_RETURN(const bool zero_point, flag(j, "zero_point", !s.symmetric, path, where));
    s.symmetric = !zero_point;
  } else {
    VLM_ASSIGN_OR_RETURN(s.symmetric, flag(j, "sym", s.symmetric, path, where));
  }
  VLM_ASSIGN_OR_RETURN(s.desc_act, flag(j, "desc_act", s.desc_act, path, where));
  if (awq && s.desc_act) {
    return refuse(where, path + "desc_act", json(true), "AWQ has no activation order");
  }
  VLM_RETURN_IF_ERROR(
      only(j, path, "pack_dtype", {"int32"}, where, "vlm reads weights packed in int32 words"));
  return s;
}

// GPTQ's per-module `dynamic` overrides: what they may change (the others do not change how the
// tensors are stored, e.g. damp_percent).
Status parse_dynamic(const json& q, PrequantConfig* c, const std::string& where) {
  auto d = q.find("dynamic");
  if (d == q.end() || d->is_null()) return ok_status();
  if (!d->is_object()) return refuse(where, "dynamic", *d, "expected an object of patterns");
  for (auto it = d->begin(); it != d->end(); ++it) {
    PrequantRule r;
    const std::string key = it.key();
    r.skip = key.rfind("-:", 0) == 0;
    r.pattern = key.rfind("-:", 0) == 0 || key.rfind("+:", 0) == 0 ? key.substr(2) : key;
    if (!regex_ok(r.pattern)) {
      return refuse(where, "dynamic", json(key), "not a regular expression vlm can read");
    }
    const std::string path = "dynamic[\"" + key + "\"].";
    if (!it->is_object()) return refuse(where, path, *it, "expected an object");
    for (auto f = it->begin(); f != it->end(); ++f) {
      static const char* const kRead[] = {"bits",
                                          "group_size",
                                          "sym",
                                          "desc_act",
                                          "pack_dtype",
                                          "damp_percent",
                                          "damp_auto_increment",
                                          "static_groups",
                                          "true_sequential",
                                          "mse",
                                          "act_group_aware",
                                          "v2"};
      if (std::find_if(std::begin(kRead), std::end(kRead),
                       [&](const char* k) { return f.key() == k; }) == std::end(kRead)) {
        return refuse(where, path + f.key(), *f, "an override vlm does not read");
      }
    }
    if (!r.skip) {
      VLM_ASSIGN_OR_RETURN(PrequantScheme s, packed_scheme(*it, c->groups[0], false, path, where));
      r.scheme = c->groups.size();
      c->groups.push_back(std::move(s));
    }
    c->rules.push_back(std::move(r));
  }
  return ok_status();
}

Result<PrequantConfig> parse_gptq(const json& q, const std::string& where) {
  PrequantConfig c;
  c.method = PrequantMethod::kGptq;
  const PrequantScheme base = packed_defaults("gptq", /*symmetric=*/true);
  // checkpoint_format (GPTQModel also writes `format`; HF's default: gptq, the v1 zero points).
  std::string fmt;
  for (const char* key : {"checkpoint_format", "format"}) {
    auto f = q.find(key);
    if (f == q.end() || f->is_null()) continue;
    if (!f->is_string() || (*f != "gptq" && *f != "gptq_v2")) {
      return refuse(where, key, *f,
                    "vlm reads the gptq (v1) and gptq_v2 layouts (marlin, bitblas and the other "
                    "kernel-specific repackings are not)");
    }
    if (!fmt.empty() && *f != fmt) {
      return refuse(where, key, *f, "checkpoint_format says " + fmt);
    }
    fmt = f->get<std::string>();
  }
  if (fmt.empty()) fmt = "gptq";
  c.gptq_v1 = fmt == "gptq";
  VLM_ASSIGN_OR_RETURN(PrequantScheme s, packed_scheme(q, base, false, "", where));
  c.groups.push_back(std::move(s));
  VLM_RETURN_IF_ERROR(parse_dynamic(q, &c, where));
  return c;
}

Result<PrequantConfig> parse_awq(const json& q, const std::string& where) {
  PrequantConfig c;
  c.method = PrequantMethod::kAwq;
  for (const char* key : {"version", "format", "checkpoint_format"}) {
    auto f = q.find(key);
    if (f == q.end() || f->is_null()) continue;
    std::string v = f->is_string() ? f->get<std::string>() : std::string();
    std::transform(v.begin(), v.end(), v.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    if (v != "gemm") {
      return refuse(where, key, *f,
                    "vlm reads AWQ's GEMM packing (gemv, gemv_fast, marlin and the other "
                    "layouts are not)");
    }
  }
  // (zero_point: true unless said)
  VLM_ASSIGN_OR_RETURN(
      PrequantScheme s,
      packed_scheme(q, packed_defaults("awq", /*symmetric=*/false), true, "", where));
  c.groups.push_back(std::move(s));
  VLM_RETURN_IF_ERROR(string_list(q, "modules_to_not_convert", "", where, &c.ignore));
  return c;
}

}  // namespace

Result<PrequantConfig> parse_prequant_config(const std::string& text, const std::string& where) {
  if (text.empty()) return PrequantConfig{};
  const json q = json::parse(text, nullptr, false);
  if (q.is_discarded()) return invalid_argument(where + ": quantization_config is not JSON");
  if (q.is_null()) return PrequantConfig{};
  if (!q.is_object()) return refuse(where, "", q, "expected an object");
  // (A field of another type than the format's, e.g. a null strategy, is refused as such.)
  try {
    const json m = q.value("quant_method", json());
    if (m == json("fp8")) return parse_fp8(q, where);
    if (m == json("compressed-tensors")) return parse_compressed_tensors(q, where);
    if (m == json("gptq")) return parse_gptq(q, where);
    if (m == json("awq")) return parse_awq(q, where);
  } catch (const json::exception& e) {
    return invalid_argument(where + ": quantization_config: a field has the wrong type (" +
                            e.what() + ")");
  }
  return refuse(
      where, "quant_method", q.value("quant_method", json()),
      "vlm loads Qwen's FP8 (fp8), llm-compressor's compressed-tensors, GPTQ (gptq) and AWQ "
      "(awq) checkpoints");
}

std::string PrequantConfig::describe() const {
  if (method == PrequantMethod::kNone) return "none";
  std::string out;
  for (const PrequantScheme& s : groups) {
    if (!out.empty()) out += "; ";
    if (method == PrequantMethod::kFp8) {
      out += "FP8 e4m3 (" + std::to_string(s.block_rows) + "×" + std::to_string(s.block_cols) +
             " blocks)";
      continue;
    }
    if (method == PrequantMethod::kCompressedTensors) out += s.format + " ";
    out += (s.is_float ? "fp8" : "int" + std::to_string(s.bits)) + " (" + s.strategy;
    if (s.strategy == "group") out += " " + std::to_string(s.group_size);
    if (s.strategy == "block") {
      out += " " + std::to_string(s.block_rows) + "×" + std::to_string(s.block_cols);
    }
    if (s.desc_act) out += ", act-order";
    out += s.symmetric ? ")" : ", zero points)";
  }
  switch (method) {
    case PrequantMethod::kFp8:
      return "Qwen " + out;
    case PrequantMethod::kGptq:
      return (gptq_v1 ? "GPTQ " : "GPTQ v2 ") + out;
    case PrequantMethod::kAwq:
      return "AWQ GEMM " + out;
    default:
      return "compressed-tensors " + out;
  }
}

float e4m3_to_f32(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return std::nanf("");
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(static_cast<float>(8 + man), exp - 10);
  return sign ? -mag : mag;
}

}  // namespace vlm
