#include "engine_probes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <vector>

// The engine's internals: this file alone among the tools includes them (tests/check_layering.sh).
#include "core/clock.h"
#include "engine/engine_access.h"
#include "engine/engine_impl.h"
#include "engine/multimodal.h"
#include "engine/structured_output.h"
#include "ops/ops.h"
#include "structured/matcher.h"

namespace vlm_cli {

using namespace vlm;  // NOLINT: the engine's internal names, throughout this file

namespace {

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

Result<GrammarTimings> grammar_timings(StructuredOutputs& outputs,
                                       const std::vector<int32_t>& end_ids,
                                       const StructuredOutput& so, int reps, int sequences,
                                       int max_steps, uint64_t seed) {
  using structured::CompiledGrammar;
  using structured::GrammarMatcher;
  GrammarTimings t;
  const Clock::time_point t_trie = Clock::now();
  auto vocab = outputs.vocab();
  t.token_trie_ms = us_since(t_trie) / 1000;
  std::shared_ptr<CompiledGrammar> cg;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const Clock::time_point t0 = Clock::now();
    VLM_ASSIGN_OR_RETURN(structured::Grammar g, build_grammar(so));
    cg = std::make_shared<CompiledGrammar>(g, vocab);
    t.compile_ms.push_back(us_since(t0) / 1000);
  }
  const int64_t V = vocab->vocab_size();
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> allowed;
  std::mt19937_64 rng(seed);
  for (int seq = 0; seq < sequences; ++seq) {
    GrammarMatcher m(cg, end_ids);
    for (int step = 0; step < max_steps && !m.terminated(); ++step) {
      std::fill(logits.begin(), logits.end(), 0.f);
      const Clock::time_point t0 = Clock::now();
      m.apply(logits.data());
      double us = us_since(t0);
      allowed.clear();
      for (int64_t i = 0; i < V; ++i) {
        if (logits[static_cast<size_t>(i)] == 0.f) allowed.push_back(static_cast<int32_t>(i));
      }
      if (allowed.empty()) return internal_error("the grammar's mask left no token");
      const int32_t pick = allowed[rng() % allowed.size()];
      const Clock::time_point t1 = Clock::now();
      if (!m.accept(pick)) return internal_error("the grammar refused a token its mask allowed");
      us += us_since(t1);
      t.step_us.push_back(us);
      if (seq == 0) t.first_step_us.push_back(us);
    }
    t.complete += m.terminated();
  }
  const auto st = cg->stats();
  t.states = st.states;
  t.mask_walks = st.mask_walks;
  t.mask_hits = st.mask_hits;
  return t;
}

// For the benchmarks' encode_image / encode_video: on the engine thread, between steps (the tower
// and the thread pool are the core's), `stage` makes `*s` ready and the tower encodes it.
Status stage_and_encode(EngineImpl& m, const std::function<Status(StagedImage*)>& stage,
                        StagedImage* s, double* encode_ms) {
  if (!m.has_vision) return invalid_argument("this checkpoint has no vision tower");
  Status st;
  m.core->run_on_engine_thread([&] {
    st = stage(s);
    if (st.ok()) st = encode_staged_image(*m.vision, s, encode_ms);
  });
  return st;
}

// What an image's or a video's staging and encode measured (the encode time set by the caller).
void copy_staged(const StagedImage& s, ImageTimings* t) {
  t->decode_ms = s.decode_ms;
  t->preprocess_ms = s.preprocess_ms;
  t->resized_h = s.resized_h;
  t->resized_w = s.resized_w;
  t->vision_tokens = s.encoded->out.tokens;
}

}  // namespace

vlm::Result<ImageTimings> encode_image(vlm::Engine& engine, const vlm::ImageInput& image) {
  EngineImpl& m = EngineAccess::impl(engine);
  StagedImage s;
  ImageTimings t;
  VLM_RETURN_IF_ERROR(stage_and_encode(
      m,
      [&](StagedImage* out) {
        return stage_image(image, m.preprocess, nullptr, m.pool.get(), out);
      },
      &s, &t.encode_ms));
  copy_staged(s, &t);
  return t;
}

vlm::Result<VideoTimings> encode_video(vlm::Engine& engine, const vlm::VideoInput& video) {
  EngineImpl& m = EngineAccess::impl(engine);
  StagedImage s;
  VideoTimings t;
  VLM_RETURN_IF_ERROR(stage_and_encode(
      m, [&](StagedImage* out) { return stage_video(video, m.video, nullptr, m.pool.get(), out); },
      &s, &t.encode_ms));
  t.frames = s.frames;
  t.decoded_frames = s.decoded_frames;
  t.groups = s.groups;
  copy_staged(s, &t);
  return t;
}

vlm::Result<GrammarTimings> time_grammar(const vlm::Engine& engine, const vlm::StructuredOutput& so,
                                         int reps, int sequences, int max_steps, uint64_t seed) {
  const EngineImpl& m = EngineAccess::impl(engine);
  if (!m.tokenizer) return invalid_argument("structured output needs the model's tokenizer");
  // Its own cache, so that every compile and the first sequence's masks start cold.
  StructuredOutputs outputs(m.tokenizer, m.cfg.text_config.vocab_size);
  return grammar_timings(outputs, m.eos_ids, so, reps, sequences, max_steps, seed);
}

vlm::Result<std::vector<double>> time_decode_attention(vlm::Engine& engine, int64_t context,
                                                       vlm::KvCacheDtype dtype, int reps) {
  EngineImpl& m = EngineAccess::impl(engine);
  if (m.backend->device() != ops::Device::kCpu) {
    return invalid_argument("time_decode_attention runs on the CPU backend");
  }
  if (context < 1 || reps < 1) return invalid_argument("context and reps must be positive");
  const DType t = dtype == KvCacheDtype::kBF16   ? DType::kBF16
                  : dtype == KvCacheDtype::kInt8 ? DType::kI8
                                                 : DType::kF32;
  const Qwen3VLTextConfig& c = m.cfg.text_config;
  // Full-attention layers only (a hybrid model's Gated DeltaNet layers keep no K/V).
  const int64_t layers = c.num_hidden_layers - c.num_linear_layers(), n_kv = c.num_key_value_heads,
                hd = c.head_dim;
  const int64_t heads = c.num_attention_heads, row = n_kv * hd, bs = 16;
  const int64_t blocks = (context + bs - 1) / bs, rows = blocks * bs;
  struct Layer {  // in the backend's memory, as the KV cache is (2 MiB pages on the CPU)
    ops::Buffer k, v, ks, vs;
  };
  std::vector<Layer> cache(static_cast<size_t>(layers));
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
  uint32_t state = 12345;
  auto next = [&state] {  // values in [-2, 2)
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1 << 24) * 4.f - 2.f;
  };
  std::vector<float> src(static_cast<size_t>(row)), q(static_cast<size_t>(heads * hd)),
      out(q.size());
  for (float& x : q) x = next();
  for (Layer& l : cache) {
    VLM_ASSIGN_OR_RETURN(l.k, m.backend->alloc(rows * row, t, /*lazy=*/true));
    VLM_ASSIGN_OR_RETURN(l.v, m.backend->alloc(rows * row, t, /*lazy=*/true));
    if (t == DType::kI8) {
      VLM_ASSIGN_OR_RETURN(l.ks, m.backend->alloc(rows * n_kv, DType::kF32, /*lazy=*/true));
      VLM_ASSIGN_OR_RETURN(l.vs, m.backend->alloc(rows * n_kv, DType::kF32, /*lazy=*/true));
    }
    for (int64_t r = 0; r < context; ++r) {
      for (float& x : src) x = next();
      ops::store_kv_row(src.data(), n_kv, hd, t, l.k.buf().data, l.ks.as<float>(), r);
      for (float& x : src) x = next();
      ops::store_kv_row(src.data(), n_kv, hd, t, l.v.buf().data, l.vs.as<float>(), r);
    }
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  std::vector<double> ms;
  m.core->run_on_engine_thread([&] {
    for (int r = -1; r < reps; ++r) {  // one untimed pass first
      const auto t0 = Clock::now();
      for (Layer& l : cache) {
        ops::KvPool kv;
        kv.k = l.k.buf().data;
        kv.v = l.v.buf().data;
        kv.k_scale = l.ks.as<float>();
        kv.v_scale = l.vs.as<float>();
        kv.type = t;
        ops::attention_paged(q.data(), 1, context - 1, kv, table.data(), bs, heads, n_kv, hd, scale,
                             out.data(), *m.pool, m.isa);
      }
      if (r >= 0) ms.push_back(ms_since(t0));
    }
  });
  return ms;
}

vlm::Result<std::vector<double>> time_delta_rule(vlm::Engine& engine, int64_t tokens, int64_t chunk,
                                                 int reps) {
  EngineImpl& m = EngineAccess::impl(engine);
  if (m.backend->device() != ops::Device::kCpu) {
    return invalid_argument("time_delta_rule runs on the CPU backend");
  }
  const Qwen3VLTextConfig& c = m.cfg.text_config;
  const int64_t layers = c.num_linear_layers();
  if (layers == 0)
    return invalid_argument("--delta-rule: the model has no linear-attention layers");
  if (tokens < 1 || chunk < 1 || reps < 1) {
    return invalid_argument("tokens, chunk and reps must be positive");
  }
  const ops::DeltaNetShape s = delta_net_shape(c);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](std::vector<float>& v, size_t n, float scale) {
    v.resize(n);
    for (float& x : v) x = normal(rng) * scale;
  };
  std::vector<float> proj, conv_w, a_log, dt_bias;
  fill(proj, static_cast<size_t>(tokens * s.proj_dim()), 1.f);
  fill(conv_w, static_cast<size_t>(s.kernel * s.conv_dim()), 0.3f);
  fill(a_log, static_cast<size_t>(s.nv), 0.5f);
  fill(dt_bias, static_cast<size_t>(s.nv), 0.5f);
  std::vector<float> mixed(static_cast<size_t>(tokens * s.mixed_dim())),
      out(static_cast<size_t>(tokens * s.nv * s.dv));
  std::vector<std::vector<float>> states(static_cast<size_t>(layers),
                                         std::vector<float>(static_cast<size_t>(s.state_floats())));
  std::vector<double> ms;
  m.core->run_on_engine_thread([&] {
    for (int r = -1; r < reps; ++r) {  // one untimed pass first
      const auto t0 = Clock::now();
      for (std::vector<float>& st : states) {
        const ops::DeltaNetSeq q{0, tokens, true, st.data(), st.data() + s.conv_state()};
        ops::gated_delta_net(proj.data(), s.proj_dim(), &q, 1, s, conv_w.data(), a_log.data(),
                             dt_bias.data(), mixed.data(), out.data(), *m.pool, m.isa, chunk);
      }
      if (r >= 0) ms.push_back(ms_since(t0));
    }
  });
  return ms;
}

}  // namespace vlm_cli
