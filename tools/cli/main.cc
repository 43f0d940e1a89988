// The `vlm` command line: run, serve, tune, tokenize, detokenize, logits, bench, pull, ls, rm.
// Uses only the public API (include/vlm). Every error: one line on stderr, exit code 1 (`vlm tune`
// is the Python tuner, with its own exit codes).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench.h"
#include "build_info.h"
#include "config_file.h"
#include "hub_commands.h"
#include "npy_writer.h"
#include "options.h"
#include "probes.h"
#include "tune_command.h"
#include "vlm/chat.h"
#include "vlm/engine.h"
#include "vlm/log.h"
#include "vlm/server.h"
#include "vlm/tokenizer.h"

namespace {

int fail(const std::string& msg) {
  vlm::log(vlm::LogLevel::kError, msg);
  return 1;
}

int fail(const vlm::Status& s) { return fail(s.message()); }

// The model `vlm run` and `vlm serve` use without -m, the tiny Qwen3.5: beside an installed
// binary (PREFIX/bin/vlm → PREFIX/share/vlm/models/tiny-qwen35, or where the install's
// directories put them, wherever PREFIX was moved), else,
// for the binary in its build folder, the checkout's models/tiny-qwen35.
std::string default_model_dir() {
  return vlm_cli::data_path(std::string(VLM_INSTALLED_DATA_REL) + "/models/tiny-qwen35",
                            VLM_SOURCE_DIR "/models/tiny-qwen35", "config.json");
}

constexpr const char* kDefaultModelHelp =
    "; default: the tiny shapes model (PREFIX/share/vlm/models/tiny-qwen35 beside an installed "
    "PREFIX/bin/vlm, else the checkout's models/tiny-qwen35)";

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s.empty() ? "none" : s;
}

// `vlm --version`: the build (version, commit, type, kernels, CUDA) and what this CPU runs of it.
std::string version_text() {
  const vlm::SystemInfo s = vlm::system_info();
  const std::string commit = vlm_build_commit();
  std::string t = "vlm " + s.version + " (commit " + (commit.empty() ? "unknown" : commit) + ", " +
                  VLM_BUILD_TYPE + " build)\n";
  t += "CPU kernels built: " + joined(s.isas_built) + "; extras: " + joined(s.extras_built) + "\n";
  t += "CPU kernels this CPU runs: " + joined(s.isas_runnable) +
       "; extras: " + joined(s.extras_runnable) + "; default level: " + s.isa_auto + "\n";
  t += std::string("CUDA backend: ") + (s.cuda_built
                                            ? "built (--device cuda)"
                                            : "not built (no nvcc when this build was configured)");
  return t;
}

// "1,2,3" or "[1, 2, 3]" → ids.
bool parse_ids(const std::string& text, std::vector<int32_t>* out, std::string* err) {
  std::string s;
  for (char c : text) s += (c == '[' || c == ']' || c == ',') ? ' ' : c;
  std::istringstream in(s);
  std::string tok;
  while (in >> tok) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
      *err = "'" + tok + "' is not a token id";
      return false;
    }
    out->push_back(static_cast<int32_t>(v));
  }
  if (out->empty()) {
    *err = "no token ids given";
    return false;
  }
  return true;
}

std::string json_ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

std::vector<vlm::ImageInput> image_inputs(const std::vector<std::string>& paths, int64_t min_pixels,
                                          int64_t max_pixels) {
  std::vector<vlm::ImageInput> out;
  for (const auto& p : paths) {
    vlm::ImageInput in;
    in.path = p;
    if (min_pixels > 0) in.min_pixels = min_pixels;
    if (max_pixels > 0) in.max_pixels = max_pixels;
    out.push_back(std::move(in));
  }
  return out;
}

// --video FILE with --fps / --max-frames (unset: the model's video_preprocessor_config.json).
std::vector<vlm::VideoInput> video_inputs(const std::vector<std::string>& paths, double fps,
                                          int64_t max_frames) {
  std::vector<vlm::VideoInput> out;
  for (const auto& p : paths) {
    vlm::VideoInput in;
    in.path = p;
    if (fps != -1) in.fps = fps;  // the engine checks the value
    if (max_frames != -1) in.max_frames = max_frames;
    out.push_back(std::move(in));
  }
  return out;
}

// " int8" / " int4" when the weights were quantized at load, else "" (appended to the kernel
// level).
std::string quant_suffix(const vlm::Engine& engine) {
  return engine.quant() == vlm::Quant::kNone ? std::string()
                                             : std::string(" ") + vlm::quant_name(engine.quant());
}

struct RunArgs {
  std::string model;
  std::vector<std::string> images;
  int64_t min_pixels = -1, max_pixels = -1;
  std::vector<std::string> videos;
  double fps = -1;
  int64_t max_frames = -1;
  std::string prompt;
  std::string system;
  bool raw = false;
  int64_t max_new_tokens = -1;
  double temperature = -1, top_p = -1, min_p = -1, repetition_penalty = -1;
  double presence_penalty = 0, frequency_penalty = 0;
  int64_t top_k = -1;
  int64_t seed = -1;
  bool greedy = false, ignore_eos = false;
  std::vector<std::string> stop;
  int threads = 0;
  int64_t ctx = 0;
  vlm::Quant quant = vlm::Quant::kNone;
  int64_t int4_group = vlm::kInt4DefaultGroupSize;
  bool mmap = false;
  bool vision_fp16 = false;
  vlm::EngineOptions device;  // --device and the GPU options
  std::string chat_template;  // --chat-template FILE (else the checkpoint's)
  // Structured output: at most one of these.
  std::string json_schema_file, grammar_file, regex;
  bool json_object = false;
  std::vector<std::string> choices;
};

// The file's bytes, or an error naming it.
vlm::Result<std::string> read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return vlm::not_found("cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// --json-schema / --json / --regex / --choice / --grammar → the request's structured output.
vlm::Status structured_output(const RunArgs& a, vlm::StructuredOutput* out) {
  using Kind = vlm::StructuredOutput::Kind;
  const int asked = !a.json_schema_file.empty() + a.json_object + !a.regex.empty() +
                    !a.choices.empty() + !a.grammar_file.empty();
  if (asked > 1) {
    return vlm::invalid_argument(
        "--json-schema, --json, --regex, --choice and --grammar exclude each other");
  }
  if (!a.json_schema_file.empty()) {
    VLM_ASSIGN_OR_RETURN(out->spec, read_text_file(a.json_schema_file));
    out->kind = Kind::kJsonSchema;
  } else if (!a.grammar_file.empty()) {
    VLM_ASSIGN_OR_RETURN(out->spec, read_text_file(a.grammar_file));
    out->kind = Kind::kGrammar;
  } else if (a.json_object) {
    out->kind = Kind::kJsonObject;
  } else if (!a.regex.empty()) {
    out->spec = a.regex;
    out->kind = Kind::kRegex;
  } else if (!a.choices.empty()) {
    out->choices = a.choices;
    out->kind = Kind::kChoice;
  }
  return vlm::ok_status();
}

int cmd_run(const RunArgs& a) {
  vlm::EngineOptions opts = a.device;
  opts.model_dir = a.model;
  opts.n_threads = a.threads;
  opts.max_context = a.ctx;
  opts.quant = a.quant;
  opts.int4_group = a.int4_group;
  opts.mmap_weights = a.mmap;
  opts.vision_fp16 = a.vision_fp16;
  opts.chat_template = a.chat_template;
  auto engine_or = vlm::Engine::load(opts);
  if (!engine_or.ok()) return fail(engine_or.status());
  vlm::Engine& engine = **engine_or;
  for (const std::string& n : engine.load_notes())
    vlm::log_printf(vlm::LogLevel::kInfo, "%s", n.c_str());

  std::string prompt_text = a.prompt;
  if (!a.raw) {
    auto tpl = engine.chat_template();  // the checkpoint's, or --chat-template
    if (!tpl.ok()) return fail(tpl.status());
    std::vector<vlm::ChatMessage> msgs;
    auto text_message = [](const char* role, const std::string& text) {
      vlm::ChatMessage m;
      m.role = role;
      m.text = text;
      return m;
    };
    if (!a.system.empty()) msgs.push_back(text_message("system", a.system));
    vlm::ChatMessage user = text_message("user", a.prompt);
    if (!a.images.empty() || !a.videos.empty()) {
      // Images and videos first, then the question (the usual Qwen-VL layout).
      user.content_is_text = false;
      for (size_t i = 0; i < a.images.size(); ++i)
        user.parts.push_back(vlm::ChatPart::of_image({}));
      for (size_t i = 0; i < a.videos.size(); ++i)
        user.parts.push_back(vlm::ChatPart::of_video({}));
      user.parts.push_back(vlm::ChatPart::of_text(a.prompt));
    }
    msgs.push_back(user);
    auto rendered = (*tpl)->render(msgs, {});
    if (!rendered.ok()) return fail(rendered.status());
    prompt_text = std::move(rendered).value();
  }
  vlm::GenerateRequest req;
  req.prompt_ids = engine.tokenizer()->encode(prompt_text);
  req.images = image_inputs(a.images, a.min_pixels, a.max_pixels);
  req.videos = video_inputs(a.videos, a.fps, a.max_frames);
  if (a.max_new_tokens >= 0) req.max_new_tokens = a.max_new_tokens;
  auto& s = req.sampling;
  if (a.temperature >= 0) s.temperature = a.temperature;
  if (a.top_k >= 0) s.top_k = a.top_k;
  if (a.top_p >= 0) s.top_p = a.top_p;
  if (a.min_p >= 0) s.min_p = a.min_p;
  if (a.repetition_penalty >= 0) s.repetition_penalty = a.repetition_penalty;
  s.presence_penalty = a.presence_penalty;
  s.frequency_penalty = a.frequency_penalty;
  if (a.seed >= 0) s.seed = static_cast<uint64_t>(a.seed);
  if (a.greedy) s.do_sample = false;
  req.stop = a.stop;
  req.ignore_eos = a.ignore_eos;
  if (vlm::Status st = structured_output(a, &req.structured); !st.ok()) return fail(st);

  bool wrote = false;
  auto res = engine.generate(req, [&wrote](const vlm::TokenEvent& ev) {
    if (!ev.text.empty()) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
      wrote = true;
    }
    return true;
  });
  // The reply's line ends; a request that failed before any text leaves stdout empty.
  if (res.ok() || wrote) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (!res.ok()) return fail(res.status());
  const auto& r = *res;
  const double n_gen = static_cast<double>(r.output_ids.size());
  // Decode rate counts the tokens produced by decode steps (the first comes from prefill).
  const double decode_tps = n_gen > 1 && r.decode_ms > 0 ? (n_gen - 1) / (r.decode_ms / 1000) : 0;
  std::string images;
  if (!req.images.empty()) {
    char buf[256];
    std::snprintf(
        buf, sizeof buf,
        "images %zu: %lld vision tokens, decode %.0f ms, preprocess %.0f ms, encode %.0f ms | ",
        req.images.size(), static_cast<long long>(r.vision_tokens), r.image_decode_ms,
        r.preprocess_ms, r.vision_encode_ms);
    images = buf;
  }
  if (!req.videos.empty()) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "videos %zu: %lld frames, %lld vision tokens, decode %.0f ms | ",
                  req.videos.size(), static_cast<long long>(r.video_frames),
                  static_cast<long long>(r.video_tokens), r.video_decode_ms);
    images += buf;
  }
  const vlm::Engine::CoreStats cs = engine.core_stats();
  if (cs.spec_tokens > 0) {  // the proposals, and the tokens a decode step made on average
    // Each decode step makes one token and its accepted proposals.
    const double steps = std::max(1.0, n_gen - 1 - static_cast<double>(cs.spec_accepted_tokens));
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "spec: %lld of %lld proposed tokens accepted, %.2f tokens per decode step | ",
                  static_cast<long long>(cs.spec_accepted_tokens),
                  static_cast<long long>(cs.spec_draft_tokens),
                  n_gen > 1 ? (n_gen - 1) / steps : 0.0);
    images += buf;
  }
  vlm::log_printf(
      vlm::LogLevel::kInfo,
      "%sprompt %lld tokens, prefill %.1f tok/s (%.0f ms) | generated %lld tokens, "
      "decode %.2f tok/s | peak RSS %.1f MiB | %s%s x%d",
      images.c_str(), static_cast<long long>(r.prompt_tokens),
      r.prefill_ms > 0 ? r.prompt_tokens / (r.prefill_ms / 1000) : 0.0, r.prefill_ms,
      static_cast<long long>(r.output_ids.size()), decode_tps,
      vlm_cli::peak_rss_bytes() / 1048576.0,
      engine.device() == "cpu" ? vlm::cpu_isa_name(engine.cpu_isa()) : engine.device().c_str(),
      quant_suffix(engine).c_str(), engine.n_threads());
  return 0;
}

// `vlm run`'s options.
void add_run_options(CLI::App* run, RunArgs* ra) {
  ra->model = default_model_dir();
  run->add_option("-m,--model", ra->model,
                  std::string("Checkpoint directory (config.json, *.safetensors, tokenizer.json) "
                              "or GGUF file") +
                      vlm_cli::kModelNameHelp + kDefaultModelHelp);
  run->add_option("-p,--prompt", ra->prompt, "User message")->required();
  run->add_option("--chat-template", ra->chat_template,
                  "Chat template file (.jinja, or .json with \"chat_template\") instead of the "
                  "checkpoint's own");
  run->add_option("--image", ra->images, "Image file (JPEG, PNG, WebP, GIF, BMP); repeatable");
  run->add_option("--min-pixels", ra->min_pixels, "Resize budget: least pixels per image");
  run->add_option("--max-pixels", ra->max_pixels, "Resize budget: most pixels per image");
  run->add_option("--video", ra->videos,
                  "Video file (MP4, MOV, WebM, MKV, AVI, GIF, animated WebP); repeatable");
  run->add_option("--fps", ra->fps, "Video frames sampled per second (default: the model's, 2)");
  run->add_option("--max-frames", ra->max_frames,
                  "Most frames sampled from each video (default: the model's, 768)");
  run->add_option("--system", ra->system, "System message");
  run->add_flag("--raw", ra->raw, "Feed the prompt as is, without the chat template");
  run->add_option("-n,--max-new-tokens", ra->max_new_tokens, "Tokens to generate at most");
  run->add_option("--temperature", ra->temperature, "Sampling temperature (0 = greedy)");
  run->add_option("--top-k", ra->top_k, "Top-k (0 = off)");
  run->add_option("--top-p", ra->top_p, "Top-p (1 = off)");
  run->add_option("--min-p", ra->min_p, "Min-p (0 = off)");
  run->add_option("--repetition-penalty", ra->repetition_penalty, "Repetition penalty (1 = off)");
  run->add_option("--presence-penalty", ra->presence_penalty, "Presence penalty");
  run->add_option("--frequency-penalty", ra->frequency_penalty, "Frequency penalty");
  run->add_option("--seed", ra->seed, "Random seed");
  run->add_flag("--greedy", ra->greedy, "Greedy decoding");
  run->add_option("--stop", ra->stop, "Stop string (repeatable)");
  run->add_flag("--ignore-eos", ra->ignore_eos, "Do not stop at end-of-sequence tokens");
  run->add_option("--json-schema", ra->json_schema_file,
                  "Structured output: the reply is JSON valid under the JSON Schema in FILE");
  run->add_flag("--json", ra->json_object, "Structured output: the reply is a JSON object");
  run->add_option("--regex", ra->regex, "Structured output: the reply matches the pattern in full");
  run->add_option("--choice", ra->choices,
                  "Structured output: the reply is exactly one of these (repeatable)");
  run->add_option("--grammar", ra->grammar_file,
                  "Structured output: the reply follows the GBNF grammar in FILE (rule root)");
  run->add_option("-t,--threads", ra->threads, "Threads (0 = all)");
  run->add_option("-c,--ctx", ra->ctx, "Context limit in tokens (0 = model maximum)");
  vlm::cli::add_quant_option(run, &ra->quant, &ra->int4_group);
  run->add_flag("--mmap", ra->mmap, vlm::cli::kMmapHelp);
  run->add_flag("--vision-fp16", ra->vision_fp16, vlm::cli::kVisionFp16Help);
  vlm::cli::add_mmproj_option(run, &ra->device);
  vlm::cli::add_device_options(run, &ra->device);
  vlm::cli::add_spec_options(run, &ra->device.batching.spec);
}

struct TokenizeArgs {
  std::string model, text, file;
  bool split_special = false;
  CLI::Option* text_opt = nullptr;
  CLI::Option* file_opt = nullptr;
};

void add_tokenize_options(CLI::App* tokenize, TokenizeArgs* ta) {
  tokenize
      ->add_option("-m,--model", ta->model,
                   std::string("Directory with tokenizer.json") + vlm_cli::kModelNameHelp)
      ->required();
  ta->text_opt = tokenize->add_option("--text", ta->text, "Text to tokenize");
  ta->file_opt = tokenize->add_option("--file", ta->file, "File whose contents to tokenize");
  ta->text_opt->excludes(ta->file_opt);
  tokenize->add_flag("--split-special", ta->split_special,
                     "Treat special-token text as plain text");
}

int cmd_tokenize(const TokenizeArgs& ta) {
  if (ta.text_opt->count() == 0 && ta.file_opt->count() == 0) return fail("give --text or --file");
  std::string text = ta.text;
  if (ta.file_opt->count()) {
    std::ifstream f(ta.file, std::ios::binary);
    if (!f) return fail("cannot open " + ta.file);
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  auto tok = vlm::Tokenizer::load(ta.model);
  if (!tok.ok()) return fail(tok.status());
  std::printf("%s\n", json_ids((*tok)->encode(text, ta.split_special)).c_str());
  return 0;
}

struct DetokenizeArgs {
  std::string model, ids;
  bool skip_special = false;
};

void add_detokenize_options(CLI::App* detokenize, DetokenizeArgs* da) {
  detokenize
      ->add_option("-m,--model", da->model,
                   std::string("Directory with tokenizer.json") + vlm_cli::kModelNameHelp)
      ->required();
  detokenize->add_option("--ids", da->ids, "Ids: 1,2,3 or [1, 2, 3]")->required();
  detokenize->add_flag("--skip-special", da->skip_special, "Drop special tokens");
}

int cmd_detokenize(const DetokenizeArgs& da) {
  std::vector<int32_t> ids;
  std::string err;
  if (!parse_ids(da.ids, &ids, &err)) return fail(err);
  auto tok = vlm::Tokenizer::load(da.model);
  if (!tok.ok()) return fail(tok.status());
  for (int32_t id : ids) {
    if (id >= (*tok)->vocab_size()) {
      return fail("token id " + std::to_string(id) + " is outside the vocabulary");
    }
  }
  std::string text = (*tok)->decode(ids, da.skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

struct LogitsArgs {
  std::string model, ids, out;
  std::vector<std::string> images, videos;
  int64_t min_pixels = -1, max_pixels = -1;
  int threads = 0;
  vlm::Quant quant = vlm::Quant::kNone;
  int64_t int4_group = vlm::kInt4DefaultGroupSize;
  bool mmap = false;
  vlm::EngineOptions device;  // --device and the GPU options
};

void add_logits_options(CLI::App* logits, LogitsArgs* la) {
  logits
      ->add_option("-m,--model", la->model,
                   std::string("Checkpoint directory (config.json + weights) or GGUF file") +
                       vlm_cli::kModelNameHelp)
      ->required();
  logits->add_option("--ids", la->ids, "Ids: 1,2,3 or [1, 2, 3]")->required();
  logits->add_option("--out", la->out, "Output .npy file")->required();
  logits->add_option("--image", la->images,
                     "Image for each <|image_pad|> id in --ids (a single pad per image; expanded)");
  logits->add_option("--video", la->videos,
                     "Video for each <|video_pad|> id in --ids (one pad between <|vision_start|> "
                     "and <|vision_end|> per video; vlm writes the timestamps and the pads)");
  logits->add_option("--min-pixels", la->min_pixels, "Resize budget: least pixels per image");
  logits->add_option("--max-pixels", la->max_pixels, "Resize budget: most pixels per image");
  logits->add_option("-t,--threads", la->threads, "Threads (0 = all)");
  vlm::cli::add_quant_option(logits, &la->quant, &la->int4_group);
  logits->add_flag("--mmap", la->mmap, vlm::cli::kMmapHelp);
  vlm::cli::add_mmproj_option(logits, &la->device);
  vlm::cli::add_device_options(logits, &la->device);
}

int cmd_logits(const LogitsArgs& la) {
  std::vector<int32_t> ids;
  std::string err;
  if (!parse_ids(la.ids, &ids, &err)) return fail(err);
  vlm::EngineOptions opts = la.device;
  opts.model_dir = la.model;
  opts.n_threads = la.threads;
  opts.require_tokenizer = false;
  opts.quant = la.quant;
  opts.int4_group = la.int4_group;
  opts.mmap_weights = la.mmap;
  auto engine = vlm::Engine::load(opts);
  if (!engine.ok()) return fail(engine.status());
  for (const std::string& n : (*engine)->load_notes())
    vlm::log_printf(vlm::LogLevel::kInfo, "%s", n.c_str());
  std::vector<int32_t> expanded;
  vlm::Engine::LogitsOptions lo;
  lo.expanded_ids = &expanded;
  lo.videos = video_inputs(la.videos, -1, -1);
  auto out = (*engine)->logits(ids, image_inputs(la.images, la.min_pixels, la.max_pixels), lo);
  if (!out.ok()) return fail(out.status());
  vlm::Status st = vlm_cli::write_npy_f32(
      la.out, out->data(), {static_cast<int64_t>(expanded.size()), (*engine)->vocab_size()});
  if (!st.ok()) return fail(st);
  return 0;
}

struct ServeArgs {
  vlm::ServeOptions so;
  bool no_webui = false;
  bool no_prefix_caching = false;
};

// `vlm serve`'s options on the engine: batching, KV cache, templates, compute.
void add_serve_engine_options(CLI::App* serve, ServeArgs* sa) {
  vlm::ServeOptions& so = sa->so;
  serve->add_option("--max-num-seqs", so.engine.batching.max_num_seqs, "Sequences per batch step");
  vlm::cli::add_spec_options(serve, &so.engine.batching.spec);
  serve->add_option("--max-batched-tokens", so.engine.batching.max_batched_tokens,
                    "Tokens per batch step (default: the prefill chunk, 256)");
  serve->add_option("--block-size", so.engine.batching.block_size, "KV cache block size in tokens");
  serve->add_option("--num-blocks", so.engine.batching.num_blocks,
                    "KV cache blocks (0 = from the context, or from --kv-cache-memory)");
  serve->add_option("--kv-cache-memory", so.engine.batching.kv_cache_memory,
                    "cpu: KV cache size in bytes (default: every sequence at full context, at "
                    "most 4 GiB); --num-blocks overrides it");
  serve->add_option("--max-waiting", so.engine.batching.max_waiting,
                    "Queued requests before 429 (default 256)");
  serve->add_option(
      "--batch-wait-ms", so.engine.batching.batch_wait_ms,
      "Batching window: an idle engine waits this long for more arrivals (default 0)");
  serve->add_option(
      "--max-encoder-ms", so.engine.batching.max_encoder_ms,
      "While requests run, each engine step spends about this long on image encodes (sliced) and "
      "prefill chunks together, so that running streams keep their pace (default 0: one decode "
      "pass, more while several requests wait; negative: whole encodes and prefills)");
  serve->add_option("--max-inflight-image-pixels", so.engine.batching.max_inflight_image_pixels,
                    "Decoded image pixels in flight at once across requests; beyond, images wait "
                    "(default 100000000; 0 = no limit)");
  serve->add_option("--chat-template", so.engine.chat_template,
                    "Chat template file (.jinja, or .json with \"chat_template\") instead of the "
                    "checkpoint's own");
  serve->add_option("--vision-cache-mib", so.engine.batching.vision_cache_mib,
                    "Memory for cached vision-encoder outputs (default 512; 0 = off)");
  serve->add_flag("--no-prefix-caching", sa->no_prefix_caching,
                  "Compute every prompt in full (default: KV blocks are reused by content)");
  serve->add_option("--state-snapshot-interval", so.engine.batching.state_snapshot_interval,
                    "Hybrid models (Qwen3.5): keep the linear-attention state for the prefix cache "
                    "every this many tokens, a multiple of the block size (default 64)");
  serve->add_option("--state-snapshots", so.engine.batching.state_snapshots,
                    "Hybrid models (Qwen3.5): how many such states the prefix cache keeps "
                    "(default --max-num-seqs; each one sequence's state, from --kv-cache-memory)");
  serve->add_option("--kv-events", so.kv_events.endpoint,
                    "Publish the prefix cache's KV events (vLLM's ZeroMQ format) on this "
                    "endpoint: tcp://*:PORT binds, tcp://HOST:PORT connects");
  serve->add_option("--kv-events-replay", so.kv_events.replay_endpoint,
                    "ZeroMQ ROUTER endpoint (bound) where subscribers ask for missed KV event "
                    "batches (default: none)");
  serve->add_option("--kv-events-topic", so.kv_events.topic,
                    "Topic frame of every KV event message (default empty)");
  serve->add_option("-t,--threads", so.engine.n_threads, "Compute threads (0 = all)");
  serve->add_option("-c,--ctx", so.engine.max_context,
                    "Context limit in tokens (0 = model maximum)");
  vlm::cli::add_quant_option(serve, &so.engine.quant, &so.engine.int4_group);
  serve->add_flag("--mmap", so.engine.mmap_weights, vlm::cli::kMmapHelp);
  serve->add_flag("--vision-fp16", so.engine.vision_fp16, vlm::cli::kVisionFp16Help);
  vlm::cli::add_mmproj_option(serve, &so.engine);
  vlm::cli::add_device_options(serve, &so.engine);
}

// `vlm serve`'s options on the API: address, names, key, pages and media.
void add_serve_api_options(CLI::App* serve, ServeArgs* sa) {
  vlm::ServeOptions& so = sa->so;
  serve->add_option("--host", so.host, "Address to listen on (default 127.0.0.1)");
  serve->add_option("--port", so.port, "Port (default 8080; 0 = any free port)");
  serve->add_option("--served-model-name", so.model_names,
                    "Names requests may give as model (several: --served-model-name a b); the "
                    "first is reported in replies and metric labels (default: the model folder)");
  serve->add_option("--api-key", so.api_key, "Require Authorization: Bearer KEY");
  serve->add_option("--responses-store", so.responses_store,
                    "Responses API: responses kept in memory for previous_response_id and GET "
                    "/v1/responses/{id}, the least recently used evicted first (default 1000; 0 "
                    "keeps none)");
  serve->add_option("--responses-store-mib", so.responses_store_mib,
                    "Responses API: MiB of stored responses at most (default 256)");
  vlm::cli::add_enum_option(
      serve, "--task", &so.task, vlm::parse_serve_task,
      "What to serve: generate (chat and completions), embed (/v1/embeddings; /v1/score and "
      "/v1/rerank by cosine similarity: Qwen3-VL-Embedding) or rerank (/v1/score, /v1/rerank: "
      "Qwen3-VL-Reranker); default auto: what the checkpoint's files say (sentence-transformers' "
      "last-token pooling: embed; a *ForSequenceClassification config over the tokens no and "
      "yes: rerank), else generate");
  serve->add_flag("--no-webui", sa->no_webui,
                  "Serve no web pages (default: the chat page at / and the dashboard at "
                  "/dashboard)");
  serve->add_option("--allowed-media-path", so.allowed_media_path,
                    "Folder file:// images may come from");
  serve->add_flag("--allow-remote-media", so.allow_remote_media,
                  "Fetch http(s):// image URLs (off by default)");
  serve->add_option(
      "--max-image-pixels", so.max_image_pixels,
      "Largest resize budget (pixels) a request may ask of one image with min_pixels / "
      "max_pixels (default 16777216)");
}

// `vlm serve`'s options on connections: threads and timeouts.
void add_serve_connection_options(CLI::App* serve, vlm::ServeOptions* so) {
  serve->add_option(
      "--http-threads", so->http_threads,
      "Worker threads for request parsing, chat templates, tokenizing and image decoding "
      "(default 8)");
  serve->add_option("--io-threads", so->io_threads,
                    "Threads for sockets, /health, /metrics and replies (default 2)");
  serve->add_option("--max-connections", so->max_connections,
                    "Open connections at once; beyond: 503 and close (default 4096)");
  serve->add_option("--header-timeout", so->header_timeout_s,
                    "Seconds a request's header may take from its first byte (default 10)");
  serve->add_option("--keep-alive-timeout", so->keep_alive_timeout_s,
                    "Seconds an idle keep-alive connection stays open (default 75)");
  serve->add_option("--body-timeout", so->body_timeout_s,
                    "Seconds a request's body may take (default 60)");
  serve->add_option(
      "--write-timeout", so->write_timeout_s,
      "Seconds a reply write may make no progress before the connection closes (default 60)");
  serve->add_option(
      "--health-timeout", so->health_timeout_s,
      "/health is 503 when the engine loop made no progress for this many seconds (default 30)");
  serve->add_option(
      "--shutdown-timeout", so->shutdown_timeout_s,
      "On SIGTERM/SIGINT, seconds running requests may take before they are cancelled "
      "(default 30)");
}

int cmd_serve(ServeArgs sa) {
  vlm::ServeOptions& so = sa.so;
  so.engine.batching.prefix_caching = !sa.no_prefix_caching;
  so.webui = !sa.no_webui;
  so.engine.prefill_chunk =
      std::max<int64_t>(so.engine.prefill_chunk, so.engine.batching.max_batched_tokens);
  so.handle_signals = true;
  auto server = vlm::Server::create(so);
  if (!server.ok()) return fail(server.status());
  vlm::log_printf(vlm::LogLevel::kInfo,
                  "serving on http://%s:%d (OpenAI API at /v1; /health says 503 until the "
                  "model is loaded)",
                  so.host.c_str(), (*server)->port());
  vlm::Status st = (*server)->run();
  if (!st.ok()) return fail(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    if (cmd == "tune") return vlm_cli::run_tune(argc, argv);  // a Python program: its own options
    if (cmd != "run" && cmd != "tokenize" && cmd != "detokenize" && cmd != "logits" &&
        cmd != "bench" && cmd != "serve" && cmd != "pull" && cmd != "ls" && cmd != "rm") {
      return fail("unknown command '" + cmd +
                  "' (commands: run, serve, tune, tokenize, detokenize, logits, bench, pull, ls, "
                  "rm)");
    }
  }
  CLI::App app{"vlm: run Qwen3-VL models from Hugging Face checkpoints"};
  app.set_version_flag("--version", version_text,
                       "Version, commit, build type, CPU kernel levels "
                       "built and found, CUDA built or not");
  app.require_subcommand(1);
  RunArgs ra;
  auto* run = app.add_subcommand("run", "Generate a reply to a prompt, streamed to stdout");
  add_run_options(run, &ra);
  TokenizeArgs ta;
  auto* tokenize = app.add_subcommand("tokenize", "Print the token ids of a text as JSON");
  add_tokenize_options(tokenize, &ta);
  DetokenizeArgs da;
  auto* detokenize = app.add_subcommand("detokenize", "Print the text of token ids");
  add_detokenize_options(detokenize, &da);
  LogitsArgs la;
  auto* logits = app.add_subcommand("logits", "Write float32 logits [positions, vocab] as .npy");
  add_logits_options(logits, &la);
  vlm_cli::BenchArgs ba;
  auto* bench =
      app.add_subcommand("bench",
                         "Benchmark: prefill, decode, vision, batched decode and memory bandwidth "
                         "(median, min, max; table and JSON)");
  vlm_cli::add_bench_options(bench, &ba);
  for (int i = 0; i < argc; ++i) ba.command += (i ? " " : "") + std::string(argv[i]);
  ServeArgs sa;
  auto* serve = app.add_subcommand("serve", "Serve an OpenAI-compatible API (continuous batching)");
  sa.so.engine.model_dir = default_model_dir();
  serve->add_option("-m,--model", sa.so.engine.model_dir,
                    std::string("Checkpoint directory or GGUF file") + vlm_cli::kModelNameHelp +
                        kDefaultModelHelp);
  add_serve_api_options(serve, &sa);
  add_serve_engine_options(serve, &sa);
  add_serve_connection_options(serve, &sa.so);
  std::string serve_config;
  vlm_cli::add_config_option(serve, &serve_config);
  vlm_cli::HubArgs ha;
  vlm_cli::add_hub_commands(&app, &ha);
  std::string hf_token;  // -m ORG/NAME: see hub_commands.h
  for (CLI::App* sub : {run, tokenize, detokenize, logits, bench, serve}) {
    vlm_cli::add_hf_token_option(sub, &hf_token);
  }
  vlm::LogLevel log_level = vlm::LogLevel::kInfo;
  vlm::LogFormat log_format = vlm::LogFormat::kText;
  bool quiet = false;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->add_flag("-q,--quiet", quiet,
                  "Warnings and errors only: no progress, no stage or statistics lines (the "
                  "output itself is unchanged)");
    vlm::cli::add_enum_option(sub, "--log-level", &log_level, vlm::parse_log_level,
                              "What is said on stderr: error, warn, info (default) or debug");
    vlm::cli::add_enum_option(sub, "--log-format", &log_format, vlm::parse_log_format,
                              "text (default: \"vlm: ...\" lines) or json (one object a line: "
                              "time, level, msg and fields)");
  }

  // Listed for `vlm --help` only (after the common options, which it does not take): `vlm tune
  // ...` is handed to the tuner before parsing.
  app.add_subcommand("tune",
                     "Find the serving setting with the highest throughput under a latency "
                     "objective (runs the Python tuner; `vlm tune --help`)")
      ->prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help and --help-all: the help, exit code 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  }
  if (*serve) {  // before the log settings: the file may hold them
    if (vlm::Status st = vlm_cli::apply_config(serve, serve_config); !st.ok()) return fail(st);
  }
  vlm::set_log_level(quiet ? std::min(log_level, vlm::LogLevel::kWarn) : log_level);
  vlm::set_log_format(log_format);
  if (const int rc = vlm_cli::run_hub_command(ha); rc >= 0) return rc;
  // Model names (ORG/NAME[@REVISION][:QUANT]) become their files in the Hugging Face cache.
  vlm::Status named = vlm::ok_status();
  auto resolve = [&](std::string* model, std::string* mmproj, bool weights = true) {
    if (named.ok()) named = vlm_cli::resolve_model(model, mmproj, hf_token, weights);
  };
  const std::string serve_model = sa.so.engine.model_dir;
  if (*run) resolve(&ra.model, &ra.device.mmproj);
  if (*run) resolve(&ra.device.batching.spec.draft_model, nullptr);
  if (*serve) resolve(&sa.so.engine.model_dir, &sa.so.engine.mmproj);
  if (*serve) resolve(&sa.so.engine.batching.spec.draft_model, nullptr);
  if (*bench) resolve(&ba.model, &ba.device.mmproj);
  if (*bench) resolve(&ba.device.batching.spec.draft_model, nullptr);
  if (*tokenize) resolve(&ta.model, nullptr, /*weights=*/false);  // the tokenizer alone
  if (*detokenize) resolve(&da.model, nullptr, /*weights=*/false);
  if (*logits) resolve(&la.model, &la.device.mmproj);
  if (!named.ok()) return fail(named);
  // Served under the name it was asked by (as vLLM), unless --served-model-name says otherwise.
  if (*serve && sa.so.model_names.empty() && serve_model != sa.so.engine.model_dir) {
    sa.so.model_names.push_back(serve_model);
  }
  if (*run) return cmd_run(ra);
  if (*serve) return cmd_serve(sa);
  if (*bench) return vlm_cli::run_bench(ba);
  if (*tokenize) return cmd_tokenize(ta);
  if (*detokenize) return cmd_detokenize(da);
  if (*logits) return cmd_logits(la);
  return 0;
}
