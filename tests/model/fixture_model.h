// A fixture checkpoint loaded for the model tests that drive the weights or the decoder directly:
// its config, weight store and text-decoder weights.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "kv/kv_cache.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "model/text_decoder.h"
#include "ops/cpu_backend.h"
#include "test_util.h"
#include "vlm/engine.h"
#include "vlm/status.h"

namespace vlm::test_util {

struct FixtureModel {
  Qwen3VLConfig cfg;
  std::unique_ptr<WeightStore> store;  // the views in `text` point into its mappings
  TextWeights text;
};

// dir: a checkpoint directory, e.g. VLM_FIXTURES_DIR + "/text-f32-untied"; with mtp, its MTP
// head too.
inline Result<FixtureModel> load_fixture_model(const std::string& dir, bool mtp = false) {
  FixtureModel m;
  VLM_ASSIGN_OR_RETURN(m.cfg, load_qwen3vl_config(dir));
  VLM_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(dir));
  m.store = std::make_unique<WeightStore>(std::move(store));
  VLM_ASSIGN_OR_RETURN(m.text, load_text_weights(*m.store, m.cfg, mtp));
  return m;
}

// The options of an Engine over the fixture VLM_FIXTURES_DIR/name: 2 threads, no tokenizer
// needed, prefill chunks of 64 tokens, the engine core's limits from `batching`.
inline EngineOptions fixture_engine_options(const std::string& name,
                                            const BatchingOptions& batching = {}) {
  EngineOptions o;
  o.batching = batching;
  o.model_dir = std::string(VLM_FIXTURES_DIR) + "/" + name;
  o.require_tokenizer = false;
  o.n_threads = 2;
  o.prefill_chunk = 64;
  o.kv_cache_dtype = KvCacheDtype::kF32;  // parity tests compare with f32 K/V
  return o;
}

// An Engine with fixture_engine_options(name, batching). Null (and a failed EXPECT naming the
// error) when it does not load.
inline std::unique_ptr<Engine> load_fixture_engine(const std::string& name,
                                                   const BatchingOptions& batching = {}) {
  auto e = Engine::load(fixture_engine_options(name, batching));
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// Engine::load of fixture `name`'s config and tensors with one tensor edited: `victim` left out,
// or with `replacement` written in its place (non-null); and with `edit_config` (non-null) given
// config.json to change first. The load's status (the first error it meets, for the tests that
// check a broken checkpoint is named).
inline Status load_with_edits(const std::string& name, const std::string& victim,
                              const TensorView* replacement,
                              const std::function<void(nlohmann::json&)>& edit_config) {
  TempDir tmp;
  const std::string src = std::string(VLM_FIXTURES_DIR) + "/" + name;
  if (edit_config) {
    nlohmann::json cfg = nlohmann::json::parse(read_file(src + "/config.json"));
    edit_config(cfg);
    write_bytes((tmp.path() / "config.json").string(), cfg.dump());
  } else {
    std::filesystem::copy_file(src + "/config.json", tmp.path() / "config.json");
  }
  VLM_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(src));
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const auto& n : store.names()) {
    if (n != victim) tensors.emplace_back(n, *store.get(n));
    if (n == victim && replacement != nullptr) tensors.emplace_back(n, *replacement);
  }
  VLM_RETURN_IF_ERROR(write_safetensors((tmp.path() / "model.safetensors").string(), tensors));
  EngineOptions o;
  o.model_dir = tmp.path().string();
  o.require_tokenizer = false;
  o.n_threads = 1;
  auto e = Engine::load(o);
  return e.ok() ? ok_status() : e.status();
}

// load_with_edits with config.json as it is.
inline Status load_with_edited_tensor(const std::string& name, const std::string& victim,
                                      const TensorView* replacement) {
  return load_with_edits(name, victim, replacement, nullptr);
}

// The fixture's .json files but config.json (reference data, generation config, tokenizer) copied
// into `dir`, which the caller gives a config.json of its own.
inline void copy_fixture_json(const std::filesystem::path& src, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  for (const auto& f : fs::directory_iterator(src)) {
    const std::string fn = f.path().filename().string();
    if (fn != "config.json" && fn.size() > 5 && fn.substr(fn.size() - 5) == ".json") {
      fs::copy_file(f.path(), dir / fn, fs::copy_options::overwrite_existing);
    }
  }
}

// A layer-skipping copy of fixture `name` in `dir`: the first `layers` text decoder layers (and
// everything else: embedding, head, vision tower, tokenizer and preprocessor files), the config
// saying so; with drop_vision, without the vision tower. A draft model for speculative decoding
// that shares the fixture's tokenizer and agrees with it part of the time, as a smaller model of
// a family does.
// With mixer_gain != 1, each text layer's token mixer output (attention's o_proj, linear
// attention's out_proj; f32) is scaled by it: the model's next token then depends on the context
// more than a small random model's does.
inline Status write_truncated_fixture(const std::string& name, int64_t layers,
                                      const std::filesystem::path& dir, bool drop_vision = false,
                                      float mixer_gain = 1) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(VLM_FIXTURES_DIR) / name;
  copy_fixture_json(src, dir);
  nlohmann::json cfg = nlohmann::json::parse(test_util::read_file((src / "config.json").string()));
  nlohmann::json& t = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  t["num_hidden_layers"] = layers;
  if (t.contains("layer_types")) {  // Qwen3.5: the kinds of the layers kept
    t["layer_types"] =
        std::vector<nlohmann::json>(t["layer_types"].begin(), t["layer_types"].begin() + layers);
  }
  if (t.contains("mlp_only_layers")) {  // the dense layers among those kept
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& l : t["mlp_only_layers"]) {
      if (l.get<int64_t>() < layers) kept.push_back(l);
    }
    t["mlp_only_layers"] = kept;
  }
  {
    std::ofstream out(dir / "config.json");
    out << cfg.dump(2);
  }
  VLM_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(src.string()));
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const auto& n : store.names()) {
    const bool visual = n.find("visual") != std::string::npos;
    const auto at = n.find(".layers.");
    if ((visual && drop_vision) ||
        (at != std::string::npos && !visual && std::stoll(n.substr(at + 8)) >= layers)) {
      continue;
    }
    tensors.emplace_back(n, *store.get(n));
  }
  std::vector<std::vector<float>> scaled;  // the scaled copies the views point into
  scaled.reserve(tensors.size());
  for (auto& [n, v] : tensors) {
    const bool mixer =
        n.find("visual") == std::string::npos && (n.find("o_proj.weight") != std::string::npos ||
                                                  n.find("out_proj.weight") != std::string::npos);
    if (mixer_gain == 1 || !mixer || v.dtype != DType::kF32) continue;
    const auto* src = static_cast<const float*>(v.data);
    scaled.emplace_back(src, src + v.numel());
    for (float& x : scaled.back()) x *= mixer_gain;
    v.data = scaled.back().data();
  }
  return write_safetensors((dir / "model.safetensors").string(), tensors);
}

// The tokens a request's stream delivers until it ends (a failed EXPECT for an error piece).
inline std::vector<int32_t> stream_tokens(RequestStream& s) {
  std::vector<int32_t> out;
  RequestOutput piece;
  while (s.next(&piece)) {
    EXPECT_TRUE(piece.error.ok()) << piece.error.message();
    if (piece.token_id >= 0) out.push_back(piece.token_id);
  }
  return out;
}

// Image `name` of the vision-f32 fixture's reference.json, with its pixel budget: the synthetic
// images sit beside the fixture, the photos in the shared test data.
inline ImageInput vision_fixture_image(const nlohmann::json& ref, const std::string& name) {
  const auto& im = ref["images"][name];
  const std::string src = im["source"];
  ImageInput in;
  in.path = (src.rfind("synthetic", 0) == 0 ? std::string(VLM_FIXTURES_DIR) + "/vision-f32"
                                            : std::string(VLM_TESTDATA_DIR) + "/images") +
            "/" + src;
  in.min_pixels = im["min_pixels"].get<int64_t>();
  in.max_pixels = im["max_pixels"].get<int64_t>();
  return in;
}

// Qwen3.5 fixture `name` (qwen35-f32-a or qwen35moe-f32-a) with an MTP head, in `dir`: its files,
// its config saying mtp_num_hidden_layers 1, its tensors and the random head of
// qwen35-mtp/mtp-<name>.safetensors (scripts/make_mtp_reference.py), as a published checkpoint
// stores them. With `echo`, the head is made to propose the token it is given again (fc takes
// the embedding alone, the layer's outputs are scaled by 1/10): with a tied head, a model that
// repeats itself then finds its proposals accepted now and then.
inline Status write_mtp_fixture(const std::string& name, const std::filesystem::path& dir,
                                bool echo = false) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(VLM_FIXTURES_DIR) / name;
  copy_fixture_json(src, dir);
  nlohmann::json cfg = nlohmann::json::parse(test_util::read_file((src / "config.json").string()));
  cfg["text_config"]["mtp_num_hidden_layers"] = 1;
  {
    std::ofstream out(dir / "config.json");
    out << cfg.dump(2);
  }
  VLM_ASSIGN_OR_RETURN(WeightStore trunk, WeightStore::open_dir(src.string()));
  const fs::path head =
      fs::path(VLM_FIXTURES_DIR) / "qwen35-mtp" / ("mtp-" + name + ".safetensors");
  VLM_ASSIGN_OR_RETURN(SafetensorsFile mtp, SafetensorsFile::open(head.string()));
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const auto& n : trunk.names()) tensors.emplace_back(n, *trunk.get(n));
  for (const auto& n : mtp.names()) tensors.emplace_back(n, *mtp.get(n));
  std::vector<std::vector<float>> edited;  // the echo head's copies the views point into
  edited.reserve(tensors.size());
  for (auto& [n, v] : tensors) {
    const bool fc = n == "mtp.fc.weight";
    const bool out = n.rfind("mtp.", 0) == 0 && (n.find("o_proj") != std::string::npos ||
                                                 n.find("down_proj") != std::string::npos);
    if (!echo || (!fc && !out) || v.dtype != DType::kF32) continue;
    const auto* src = static_cast<const float*>(v.data);
    edited.emplace_back(src, src + v.numel());
    std::vector<float>& w = edited.back();
    if (fc) {  // [hidden, 2·hidden]: the identity on the embedding, nothing of the hidden state
      const int64_t H = v.dim(0);
      std::fill(w.begin(), w.end(), 0.0f);
      for (int64_t i = 0; i < H; ++i) w[static_cast<size_t>(i * 2 * H + i)] = 1.0f;
    } else {
      for (float& x : w) x *= 0.1f;
    }
    v.data = w.data();
  }
  return write_safetensors((dir / "model.safetensors").string(), tensors);
}

// A text decoder on the CPU backend, for the tests that drive TextDecoder directly.
struct CpuDecoder {
  CpuDecoder(const Qwen3VLConfig& cfg, const TextWeights& w, ThreadPool& pool, int64_t max_chunk)
      : be(pool) {
    auto d = TextDecoder::create(cfg, w, be, max_chunk);
    EXPECT_TRUE(d.ok()) << d.status().message();
    if (d.ok()) dec = std::move(*d);
  }
  // A cache of `blocks` blocks for this decoder (tables up to `blocks` wide), and for a hybrid
  // model 4 state slots.
  Status allocate(KvCache* cache, int64_t blocks, int64_t block_size) {
    return dec->allocate_cache(cache, blocks, block_size, blocks, std::nullopt,
                               dec->hybrid() ? 4 : 0);
  }
  TextDecoder* operator->() const { return dec.get(); }
  // TextDecoder::forward_batch into host logits (the CPU's memory is the backend's).
  Status forward_batch(const SeqChunk* chunks, int64_t n, const KvCache& cache, float* logits) {
    return dec->forward_batch(chunks, n, cache, ops::Buf{logits, ops::Device::kCpu, DType::kF32});
  }
  // One sequence in a single-block cache: n tokens at slots [first, first + n) (state slot 0).
  Status forward(const int32_t* ids, int64_t n, const Positions3& pos, int64_t first,
                 const KvCache& cache, LogitRows rows, float* logits) {
    static const int32_t kBlock0 = 0;
    if (cache.num_blocks() != 1) return internal_error("forward: expects a single-block cache");
    SeqChunk c;
    c.ids = ids;
    c.n = n;
    c.first = first;
    c.pos = pos;
    c.block_table = &kBlock0;
    c.num_table_blocks = 1;
    c.rows = rows;
    c.state_slot = 0;
    return forward_batch(&c, 1, cache, logits);
  }

  ops::CpuBackend be;
  std::unique_ptr<TextDecoder> dec;
};

}  // namespace vlm::test_util
