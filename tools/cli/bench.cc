#include "bench.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "build_info.h"
#include "engine_probes.h"
#include "hub_commands.h"
#include "options.h"
#include "probes.h"
#include "vlm/engine.h"
#include "vlm/log.h"
#include "vlm/pooling.h"
#include "vlm/tokenizer.h"

namespace vlm_cli {

namespace {

// ordered: the JSON keeps the order written (kind, unit, figures first), for people reading it.
using json = nlohmann::ordered_json;

int fail(const std::string& msg) {
  vlm::log(vlm::LogLevel::kError, msg);
  return 1;
}

// "128,512,2048" → {128, 512, 2048}: every item a positive integer, at least one.
bool parse_sizes(const char* flag, const std::string& text, std::vector<int64_t>* out,
                 std::string* err) {
  size_t at = 0;
  for (;;) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? comma : comma - at);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < 1 || v > (1ll << 40)) {
      *err = std::string(flag) + ": '" + item + "' is not a positive integer (give a comma " +
             "list such as 128,512,2048)";
      return false;
    }
    out->push_back(v);
    if (comma == std::string::npos) return true;
    at = comma + 1;
  }
}

// "448x448" → 448, 448.
bool parse_image_size(const std::string& text, int* w, int* h, std::string* err) {
  int cw = 0, ch = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%dx%d%c", &cw, &ch, &tail) != 2 || cw < 1 || ch < 1 ||
      cw > 16384 || ch > 16384) {
    *err = "--synthetic-image: '" + text + "' is not WIDTHxHEIGHT (1 to 16384 each, e.g. 448x448)";
    return false;
  }
  *w = cw;
  *h = ch;
  return true;
}

// A deterministic w × h picture as a 24-bit BMP file in memory: colour ramps plus pixel noise
// (xorshift32, fixed seed), so it is neither flat nor random. The vision tower's cost depends
// only on the size; BMP keeps the CLI free of image encoders (its decode is cheaper than a JPEG's).
std::vector<uint8_t> synthetic_bmp(int w, int h) {
  const uint32_t stride = (3u * static_cast<uint32_t>(w) + 3u) & ~3u;
  const uint32_t pixels = stride * static_cast<uint32_t>(h);
  std::vector<uint8_t> f(54 + pixels, 0);
  auto put32 = [&f](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) f[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  f[0] = 'B';
  f[1] = 'M';
  put32(2, 54 + pixels);  // file size
  put32(10, 54);          // pixel data offset
  put32(14, 40);          // BITMAPINFOHEADER
  put32(18, static_cast<uint32_t>(w));
  put32(22, static_cast<uint32_t>(h));  // positive: rows stored bottom-up
  f[26] = 1;                            // planes
  f[28] = 24;                           // bits per pixel, no compression
  put32(34, pixels);
  put32(38, 2835);  // 72 dpi
  put32(42, 2835);
  uint32_t rng = 0x9e3779b9u;
  auto noise = [&rng] {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return static_cast<int>(rng & 31) - 16;
  };
  auto clamp = [](int v) { return static_cast<uint8_t>(std::clamp(v, 0, 255)); };
  for (int y = 0; y < h; ++y) {
    uint8_t* row = f.data() + 54 + static_cast<size_t>(h - 1 - y) * stride;
    for (int x = 0; x < w; ++x) {
      const int r = x * 255 / std::max(1, w - 1), g = y * 255 / std::max(1, h - 1);
      const int b = ((x / 16 + y / 16) % 2) * 160 + 48;  // a 16-pixel checkerboard
      row[3 * x + 0] = clamp(b + noise());               // BMP stores B, G, R
      row[3 * x + 1] = clamp(g + noise());
      row[3 * x + 2] = clamp(r + noise());
    }
  }
  return f;
}

struct Summary {
  double median = 0, min = 0, max = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

// One line of the table and one entry of the JSON "results".
struct Row {
  std::string kind;  // JSON "kind": prefill, decode, vision_encode, ...
  std::string test;  // table: what was measured
  std::string size;  // table: at what size
  std::string unit;  // tok/s, ms, GB/s
  std::vector<double> samples;
  json fields = json::object();  // JSON: "size" and the kind's own fields
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string number(double v, const std::string& unit) {
  return fmt(unit == "ms" ? "%.1f" : "%.2f", v);
}

void print_table(FILE* out, const std::vector<Row>& rows) {
  std::vector<std::vector<std::string>> cells = {{"test", "size", "median", "min", "max", "unit"}};
  for (const Row& r : rows) {
    const Summary s = summarize(r.samples);
    cells.push_back({r.test, r.size, number(s.median, r.unit), number(s.min, r.unit),
                     number(s.max, r.unit), r.unit});
  }
  std::vector<size_t> width(6, 0);
  for (const auto& line : cells) {
    for (size_t c = 0; c < 6; ++c) width[c] = std::max(width[c], line[c].size());
  }
  auto print_line = [&](const std::vector<std::string>& line) {
    for (size_t c = 0; c < 6; ++c) {
      const bool right = c >= 2 && c <= 4;  // numbers
      std::fprintf(out, "| %*s%s%*s ", right ? static_cast<int>(width[c] - line[c].size()) : 0, "",
                   line[c].c_str(), right ? 0 : static_cast<int>(width[c] - line[c].size()), "");
    }
    std::fprintf(out, "|\n");
  };
  print_line(cells[0]);
  for (size_t c = 0; c < 6; ++c) {
    const bool right = c >= 2 && c <= 4;
    std::fprintf(out, "|%s%s", std::string(width[c] + 1, '-').c_str(), right ? ":" : "-");
  }
  std::fprintf(out, "|\n");
  for (size_t i = 1; i < cells.size(); ++i) print_line(cells[i]);
}

json row_json(const Row& r) {
  const Summary s = summarize(r.samples);
  json j = {{"kind", r.kind}, {"unit", r.unit}, {"reps", r.samples.size()}, {"median", s.median},
            {"min", s.min},   {"max", s.max},   {"samples", r.samples}};
  for (auto it = r.fields.begin(); it != r.fields.end(); ++it) j[it.key()] = it.value();
  return j;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// "model name" of the first processor in /proc/cpuinfo; "" when there is none.
std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    return line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  return "";
}

void progress(const std::string& what, const BenchArgs& a) {
  std::fprintf(stderr, "vlm bench: %s: %s%d reps\n", what.c_str(), a.no_warmup ? "" : "warmup + ",
               a.reps);
}

vlm::GenerateRequest synthetic_request(const vlm::Engine& e, int64_t prompt, int64_t new_tokens) {
  vlm::GenerateRequest req;
  req.prompt_ids = synthetic_prompt_ids(prompt, e.vocab_size());
  req.max_new_tokens = new_tokens;
  req.ignore_eos = true;
  req.sampling.do_sample = false;
  return req;
}

// Prefill of a `size`-token prompt (one generated token, so no decode step), tok/s per rep.
vlm::Result<std::vector<double>> bench_prefill(vlm::Engine& e, int64_t size, const BenchArgs& a) {
  const vlm::GenerateRequest req = synthetic_request(e, size, 1);
  std::vector<double> out;
  for (int r = a.no_warmup ? 0 : -1; r < a.reps; ++r) {
    auto res = e.generate(req);
    if (!res.ok()) return res.status();
    if (r >= 0) out.push_back(static_cast<double>(size) / (res->prefill_ms / 1000));
  }
  return out;
}

// `n` decode steps after a `prompt`-token prefill (n + 1 tokens: the first comes from the
// prefill), tok/s per rep; `ids` (non-empty): that prompt instead. The warmup makes one decode
// step.
vlm::Result<std::vector<double>> bench_decode(vlm::Engine& e, int64_t prompt, int64_t n,
                                              const BenchArgs& a, const std::vector<int32_t>& ids) {
  std::vector<double> out;
  for (int r = a.no_warmup ? 0 : -1; r < a.reps; ++r) {
    vlm::GenerateRequest req = synthetic_request(e, prompt, r < 0 ? 2 : n + 1);
    if (!ids.empty()) req.prompt_ids = ids;
    auto res = e.generate(req);
    if (!res.ok()) return res.status();
    const double steps = static_cast<double>(res->output_ids.size()) - 1;
    if (r >= 0) out.push_back(steps / (res->decode_ms / 1000));
  }
  return out;
}

// --structured's argument as a request's structured output.
vlm::Result<vlm::StructuredOutput> structured_spec(const std::string& arg) {
  vlm::StructuredOutput so;
  if (arg == "json_object") {
    so.kind = vlm::StructuredOutput::Kind::kJsonObject;
    return so;
  }
  std::ifstream f(arg, std::ios::binary);
  if (!f) return vlm::not_found("--structured: cannot open " + arg);
  so.spec.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  so.kind = vlm::StructuredOutput::Kind::kJsonSchema;
  return so;
}

// The grammar's compile time (ms per rep, each from scratch) and its token-mask time per step
// (time_grammar in engine_probes.h: 20 sequences of up to 256 steps sharing the compiled grammar).
vlm::Status bench_grammar(const vlm::Engine& e, const std::string& name,
                          const vlm::StructuredOutput& so, const BenchArgs& a,
                          std::vector<Row>* rows, std::vector<std::string>* notes) {
  VLM_ASSIGN_OR_RETURN(const GrammarTimings t, time_grammar(e, so, a.reps, 20, 256, 1));
  rows->push_back({"grammar_compile", "grammar compile", name, "ms", t.compile_ms,
                   json{{"size", name}, {"token_trie_ms", t.token_trie_ms}}});
  auto p99 = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(v.size())))];
  };
  rows->push_back({"grammar_mask", "token mask + accept per step", name, "us", t.step_us,
                   json{{"size", name},
                        {"steps", t.step_us.size()},
                        {"p99_us", p99(t.step_us)},
                        {"first_sequence_median_us", summarize(t.first_step_us).median},
                        {"first_sequence_p99_us", p99(t.first_step_us)},
                        {"complete_sequences", t.complete},
                        {"states", t.states},
                        {"mask_walks", t.mask_walks},
                        {"mask_hits", t.mask_hits}}});
  notes->push_back("grammar " + name + ": token trie " + fmt("%.1f", t.token_trie_ms) +
                   " ms; mask + accept " + std::to_string(t.step_us.size()) +
                   " steps over 20 sequences (" + std::to_string(t.complete) +
                   " complete): median " + fmt("%.1f", summarize(t.step_us).median) + " us, p99 " +
                   fmt("%.1f", p99(t.step_us)) + " us; first sequence median " +
                   fmt("%.1f", summarize(t.first_step_us).median) + " us, p99 " +
                   fmt("%.1f", p99(t.first_step_us)) + " us; " + std::to_string(t.states) +
                   " states, " + std::to_string(t.mask_walks) + " trie walks, " +
                   std::to_string(t.mask_hits) + " cached masks used");
  return vlm::ok_status();
}

// Decode tok/s without and with the grammar, reps interleaved (one of each in turn, so that
// drift hits both alike): sampled at temperature 1 with one seed; the grammar run stops where
// the grammar completes (tok/s counts the steps it made).
vlm::Status bench_decode_structured(vlm::Engine& e, const std::string& name,
                                    const vlm::StructuredOutput& so, int64_t prompt, int64_t n,
                                    const BenchArgs& a, std::vector<Row>* rows) {
  std::vector<double> plain, with;
  double steps_with = 0;
  for (int r = a.no_warmup ? 0 : -1; r < a.reps; ++r) {
    for (int k = 0; k < 2; ++k) {
      vlm::GenerateRequest req = synthetic_request(e, prompt, n + 1);
      req.sampling.do_sample = true;
      req.sampling.temperature = 1.0;
      req.sampling.seed = 7;
      if (k == 1) {
        req.structured = so;
        req.ignore_eos = false;
      }
      auto res = e.generate(req);
      if (!res.ok()) return res.status();
      const double steps = static_cast<double>(res->output_ids.size()) - 1;
      if (r < 0 || steps < 1) continue;
      (k == 0 ? plain : with).push_back(steps / (res->decode_ms / 1000));
      if (k == 1) steps_with += steps;
    }
  }
  const std::string size = std::to_string(n) + " tokens after " + std::to_string(prompt);
  json f = {{"size", n}, {"gen_tokens", n}, {"prompt_tokens", prompt}};
  rows->push_back({"decode_unconstrained", "decode, sampled", size, "tok/s", plain, f});
  f["structured"] = name;
  f["mean_steps"] = with.empty() ? 0.0 : steps_with / static_cast<double>(with.size());
  rows->push_back(
      {"decode_structured", "decode, sampled, grammar " + name, size, "tok/s", with, f});
  return vlm::ok_status();
}

struct ImageCase {
  std::string name;  // file name or "synthetic WxH"
  vlm::ImageInput input;
};

// Vision tower ms and image decode + preprocess ms per rep of one image, as two rows.
vlm::Status bench_image(vlm::Engine& e, const ImageCase& img, const BenchArgs& a,
                        std::vector<Row>* rows) {
  std::vector<double> enc, pre;
  ImageTimings t;
  for (int r = a.no_warmup ? 0 : -1; r < a.reps; ++r) {
    auto res = encode_image(e, img.input);
    if (!res.ok()) {
      // A file's errors already name its path; a synthetic image's are labelled here.
      const bool named = !img.input.path.empty() &&
                         res.status().message().find(img.input.path) != std::string::npos;
      return named ? res.status() : res.status().with_context(img.name);
    }
    t = *res;
    if (r < 0) continue;
    enc.push_back(t.encode_ms);
    pre.push_back(t.decode_ms + t.preprocess_ms);
  }
  const std::string resized = std::to_string(t.resized_w) + "x" + std::to_string(t.resized_h);
  const std::string size =
      img.name + " -> " + resized + ", " + std::to_string(t.vision_tokens) + " tokens";
  json f = {{"size", resized},
            {"image", img.name},
            {"resized_w", t.resized_w},
            {"resized_h", t.resized_h},
            {"tokens", t.vision_tokens}};
  rows->push_back({"vision_encode", "vision encode", size, "ms", enc, f});
  rows->push_back({"image_preprocess", "image decode + preprocess", size, "ms", pre, f});
  return vlm::ok_status();
}

// One video at `frames` sampled frames (min = max = frames, at a rate high enough to reach it):
// frame decoding, preprocessing (the resize included) and the vision encoder, each a row.
vlm::Status bench_video(vlm::Engine& e, const std::string& path, int64_t frames, const BenchArgs& a,
                        std::vector<Row>* rows) {
  vlm::VideoInput in;
  in.path = path;
  in.fps = 1000;
  in.min_frames = in.max_frames = frames;
  std::vector<double> dec, pre, enc;
  VideoTimings t;
  for (int r = a.no_warmup ? 0 : -1; r < a.reps; ++r) {
    auto res = encode_video(e, in);
    if (!res.ok()) return res.status();
    t = *res;
    if (r < 0) continue;
    dec.push_back(t.decode_ms);
    pre.push_back(t.preprocess_ms);
    enc.push_back(t.encode_ms);
  }
  const std::string name = path.substr(path.find_last_of('/') + 1);
  const std::string resized = std::to_string(t.resized_w) + "x" + std::to_string(t.resized_h);
  const std::string size = name + ", " + std::to_string(t.frames) + " frames -> " +
                           std::to_string(t.groups) + " x " + resized + ", " +
                           std::to_string(t.vision_tokens) + " tokens";
  json f = {{"size", t.frames},          {"video", name},
            {"frames", t.frames},        {"groups", t.groups},
            {"resized_w", t.resized_w},  {"resized_h", t.resized_h},
            {"tokens", t.vision_tokens}, {"decoded_frames", t.decoded_frames}};
  rows->push_back({"video_decode", "video frame decode", size, "ms", dec, f});
  rows->push_back({"video_preprocess", "video preprocess", size, "ms", pre, f});
  rows->push_back({"video_encode", "video vision encode", size, "ms", enc, f});
  return vlm::ok_status();
}

// --synthetic-image WxH: the generated picture, named "synthetic WxH".
vlm::Result<ImageCase> synthetic_case(const std::string& size) {
  int w = 0, h = 0;
  std::string err;
  if (!parse_image_size(size, &w, &h, &err)) return vlm::invalid_argument(err);
  ImageCase c{"synthetic " + size, {}};
  c.input.bytes = synthetic_bmp(w, h);
  return c;
}

// What one run measures: the sizes parsed from the options, or the default run's.
struct BenchPlan {
  std::vector<int64_t> prompts, gens, batches, attention, delta_chunks, video_frames, pool;
  std::vector<ImageCase> images;
  bool membw = false;
  bool default_run = false;      // no selection: the standard sizes and images, and the probe
  bool decode = false;           // decode rows (gens also serve --batch and --structured)
  int64_t gen_prompt = 128;      // the prompt before each decode measurement
  std::vector<int32_t> gen_ids;  // --gen-prompt-file's tokens (gen_prompt is their count)
  std::vector<int64_t> spec_cost;
  bool needs_model = false;
};

// The options as a plan; a bad option is an error that names it.
vlm::Result<BenchPlan> plan_bench(const BenchArgs& a) {
  BenchPlan p;
  std::string err;
  auto sizes = [&](const char* flag, const std::string& text, std::vector<int64_t>* out) {
    return text.empty() || parse_sizes(flag, text, out, &err);
  };
  if (!sizes("-p", a.prompt_sizes, &p.prompts) || !sizes("-n", a.gen_sizes, &p.gens) ||
      !sizes("--batch", a.batch_sizes, &p.batches) ||
      !sizes("--attention", a.attention_sizes, &p.attention) ||
      !sizes("--delta-rule", a.delta_chunks, &p.delta_chunks) ||
      !sizes("--pool", a.pool_sizes, &p.pool) || !sizes("--spec-cost", a.spec_cost, &p.spec_cost) ||
      !sizes("--video-frames", a.video_frames.empty() ? "8,32,128" : a.video_frames,
             &p.video_frames)) {
    return vlm::invalid_argument(err);
  }
  for (const std::string& s : a.synthetic_images) {
    VLM_ASSIGN_OR_RETURN(ImageCase c, synthetic_case(s));
    p.images.push_back(std::move(c));
  }
  for (const std::string& path : a.images) {
    ImageCase c{path.substr(path.find_last_of('/') + 1), {}};
    c.input.path = path;
    p.images.push_back(std::move(c));
  }
  for (ImageCase& c : p.images) {
    if (a.min_pixels > 0) c.input.min_pixels = a.min_pixels;
    if (a.max_pixels > 0) c.input.max_pixels = a.max_pixels;
  }
  if (a.reps < 1) return vlm::invalid_argument("-r: need at least 1 repetition");
  if (a.gen_prompt < 0)
    return vlm::invalid_argument("--gen-prompt: need a positive number of tokens");
  if (a.membw_mib < 0) return vlm::invalid_argument("--membw-mib: need a positive size");

  if (!p.spec_cost.empty() && a.device.batching.spec.method != vlm::SpecMethod::kNone) {
    return vlm::invalid_argument("--spec-cost makes its own proposals: leave out --spec");
  }
  for (int64_t k : p.spec_cost) {
    if (k > vlm::SpecOptions::kMaxTokens) {
      return vlm::invalid_argument("--spec-cost: at most " +
                                   std::to_string(vlm::SpecOptions::kMaxTokens) + " proposals");
    }
  }
  if (!a.gen_prompt_file.empty()) {  // the tokens, with the checkpoint's tokenizer
    std::ifstream f(a.gen_prompt_file, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f && !f.eof()) return vlm::invalid_argument("cannot read " + a.gen_prompt_file);
    VLM_ASSIGN_OR_RETURN(auto tok, vlm::Tokenizer::load(a.model));
    p.gen_ids = tok->encode(text);
    if (p.gen_ids.empty()) return vlm::invalid_argument(a.gen_prompt_file + " has no tokens");
  }
  p.membw = a.membw || a.membw_mib > 0;
  const bool selected = !p.prompts.empty() || !p.gens.empty() || !p.batches.empty() ||
                        !p.spec_cost.empty() || !p.images.empty() || p.membw ||
                        !p.attention.empty() || !p.delta_chunks.empty() || !a.structured.empty() ||
                        !a.videos.empty() || !p.pool.empty();
  p.default_run = !selected;
  if (p.default_run) {
    p.prompts = {128, 512, 2048};
    p.gens = {128};
    p.membw = true;
  }
  // --batch batches the decode (-n, default 128), or with --pool alone the pooling requests.
  if (((!p.batches.empty() && p.pool.empty()) || !a.structured.empty()) && p.gens.empty()) {
    p.gens = {128};
  }
  if (!p.batches.empty() && std::find(p.batches.begin(), p.batches.end(), 1) == p.batches.end()) {
    p.batches.insert(p.batches.begin(), 1);
  }
  if (!p.spec_cost.empty()) {  // --batch and -n are its batches and lengths
    if (p.gens.empty()) p.gens = {16};
    if (p.batches.empty()) p.batches = {1};
    // Each step must hold every request's proposals, and each round's prompts one step, so that
    // every timed step carries all of them (bench_spec_cost).
    const int64_t b = *std::max_element(p.batches.begin(), p.batches.end());
    const int64_t k = *std::max_element(p.spec_cost.begin(), p.spec_cost.end());
    const int64_t step = a.device.batching.max_batched_tokens > 0
                             ? a.device.batching.max_batched_tokens
                             : a.device.prefill_chunk;
    const int64_t prompt = a.gen_prompt > 0 ? a.gen_prompt : 128;
    if (b * (1 + k) > step || b * prompt > step) {
      return vlm::invalid_argument(
          "--spec-cost: a step of " + std::to_string(step) +
          " tokens must hold batch x (1 + k) = " + std::to_string(b * (1 + k)) +
          " and batch x --gen-prompt = " + std::to_string(b * prompt) +
          " tokens: raise --prefill-chunk or lower them");
    }
  }
  p.decode = (p.default_run || !a.gen_sizes.empty()) && p.spec_cost.empty();
  p.gen_prompt = a.gen_prompt > 0 ? a.gen_prompt : !p.prompts.empty() ? p.prompts[0] : 128;
  if (!p.gen_ids.empty()) p.gen_prompt = static_cast<int64_t>(p.gen_ids.size());
  p.needs_model = !p.prompts.empty() || p.decode || !p.batches.empty() || !p.images.empty() ||
                  p.default_run || !p.attention.empty() || !p.delta_chunks.empty() ||
                  !a.structured.empty() || !a.videos.empty() || !p.pool.empty();
  if (p.needs_model && a.model.empty()) {
    return vlm::invalid_argument("bench: -m is required (all but --membw need a model)");
  }
  return p;
}

// What a run found: the rows and notes it prints, and what the JSON says of the run.
struct BenchReport {
  std::vector<Row> rows;
  std::vector<std::string> notes;
  json info;
  int threads = 0;
  std::string kernels;  // what the table's footer says of the kernels
  int64_t weight_bytes = 0;
  int64_t state_bytes = 0;  // a hybrid model's linear-attention state, read per sequence per step
  double bits_per_weight = 0;       // weight_bytes · 8 / the weights they hold (scales included)
  std::vector<size_t> decode_rows;  // rows[] indices of the decode measurements
  int64_t peak_rss = 0;
  int membw_reps = 0;
  Summary read{}, copy{};  // the memory probe's medians (when it ran)
};

// --spec-cost: the proposals each decode step carries (ids 0..2, which a model seldom picks: the
// row records how many were accepted).
std::atomic<int32_t> g_forced_k{0};

// The engine for the plan: context for the longest measurement, room for the largest batch.
vlm::Result<std::unique_ptr<vlm::Engine>> load_engine(const BenchArgs& a, const BenchPlan& p) {
  int64_t max_gen = 1;
  for (int64_t n : p.gens) max_gen = std::max(max_gen, n);
  for (int64_t k : p.spec_cost) max_gen = std::max(max_gen, p.gens[0] + k);  // see bench_spec_cost
  int64_t ctx = p.gen_prompt + max_gen + 1;
  for (int64_t n : p.prompts) ctx = std::max(ctx, n + 1);
  for (int64_t n : p.pool) ctx = std::max(ctx, n + 1);
  if (!p.pool.empty() && !p.images.empty()) {
    // The embedder's prompt: an image at its largest under the models' budget, and the text.
    ctx = std::max(ctx, vlm::kPoolingImageMaxPixels / (32 * 32) + 64);
  }
  vlm::EngineOptions opts = a.device;
  opts.model_dir = a.model;
  opts.n_threads = a.threads;
  opts.require_tokenizer = !a.structured.empty();
  opts.max_context = ctx;
  opts.quant = a.quant;
  opts.int4_group = a.int4_group;
  opts.mmap_weights = a.mmap;
  opts.vision_fp16 = a.vision_fp16;
  opts.video_seek = !a.no_video_seek;
  // The engine core runs every measurement: room for the largest batch at once.
  for (int64_t b : p.batches) opts.batching.max_num_seqs = std::max(opts.batching.max_num_seqs, b);
  opts.batching.max_waiting =
      std::max<int64_t>(opts.batching.max_waiting, opts.batching.max_num_seqs);
  // Every rep computes its whole prompt (the reps repeat one prompt, which the prefix cache
  // would otherwise serve).
  opts.batching.prefix_caching = false;
  if (!p.spec_cost.empty()) {  // proposals of g_forced_k junk tokens, whatever was accepted
    vlm::SpecOptions& s = opts.batching.spec;
    s.method = vlm::SpecMethod::kCustom;
    s.num_tokens = static_cast<int32_t>(*std::max_element(p.spec_cost.begin(), p.spec_cost.end()));
    s.adaptive = false;
    s.propose = [](std::span<const int32_t> ids, int64_t, int32_t max_k, int32_t* out) {
      const int32_t k = std::min(g_forced_k.load(), max_k);
      for (int32_t j = 0; j < k; ++j) out[j] = (ids.back() + 1 + j) % 3;  // ids every model has
      return k;
    };
  }
  return vlm::Engine::load(opts);
}

// What the report says of the loaded engine: threads, kernels, quantization, weight bytes.
void describe_engine(const vlm::Engine& engine, const BenchArgs& a, BenchReport* r) {
  r->threads = engine.n_threads();
  r->weight_bytes = engine.decode_weight_bytes();
  r->state_bytes = engine.decode_state_bytes();
  const int64_t weights = engine.decode_weight_count();
  r->bits_per_weight = weights > 0 ? 8.0 * static_cast<double>(r->weight_bytes) / weights : 0.0;
  r->kernels =
      (engine.device() == "cpu" ? "" : engine.device() + " + ") +
      std::string(vlm::cpu_isa_name(engine.cpu_isa())) +
      (engine.quant() == vlm::Quant::kNone ? std::string()
                                           : std::string(" ") + vlm::quant_name(engine.quant())) +
      (engine.checkpoint_quantization().empty()
           ? std::string()
           : ", checkpoint " + engine.checkpoint_quantization()) +
      fmt(", %.3f bits per weight", r->bits_per_weight) + (a.mmap ? ", weights mmap'd" : "") +
      (engine.vision_fp16() ? ", vision fp16" : "");
  for (const std::string& n : engine.load_notes()) r->notes.push_back(n);
  if (engine.device() == "cpu") {
    r->notes.push_back("kernels: " + engine.cpu_kernels());
    r->info["cpu_kernels"] = engine.cpu_kernels();
  }
  r->info["isa"] = vlm::cpu_isa_name(engine.cpu_isa());
  r->info["device"] = engine.device();
  r->info["mmap_weights"] = a.mmap;
  r->info["vision_fp16"] = engine.vision_fp16();
  r->info["quant"] = engine.quant() == vlm::Quant::kNone ? "" : vlm::quant_name(engine.quant());
  r->info["checkpoint_quantization"] = engine.checkpoint_quantization();
  r->info["threads"] = r->threads;
  r->info["decode_weight_bytes"] = r->weight_bytes;
  r->info["decode_state_bytes"] = r->state_bytes;
  r->info["decode_weight_count"] = weights;
  r->info["bits_per_weight"] = r->bits_per_weight;
  const vlm::SpecOptions& s = a.device.batching.spec;  // (--spec-cost makes its own)
  if (s.method != vlm::SpecMethod::kNone) {
    r->info["spec"] = {{"method", vlm::spec_method_name(s.method)},
                       {"num_tokens", s.num_tokens},
                       {"ngram_min", s.ngram_min},
                       {"ngram_max", s.ngram_max}};
    if (!s.draft_model.empty()) r->info["spec"]["draft_model"] = s.draft_model;
  }
}

// With speculative decoding on: the proposals accepted between two snapshots of the counters, and
// the tokens a decode step made (`decoded`: the tokens decode steps made in between).
void add_spec_figures(const vlm::Engine::CoreStats& before, const vlm::Engine::CoreStats& after,
                      int64_t decoded, const std::string& what, json* f, BenchReport* r) {
  if (after.spec_tokens == 0) return;
  const int64_t proposed = after.spec_draft_tokens - before.spec_draft_tokens;
  const int64_t accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
  const double per_step =
      static_cast<double>(decoded) / static_cast<double>(std::max<int64_t>(1, decoded - accepted));
  (*f)["spec_proposed_tokens"] = proposed;
  (*f)["spec_accepted_tokens"] = accepted;
  (*f)["tokens_per_step"] = per_step;
  r->notes.push_back(what + ": " + std::to_string(accepted) + " of " + std::to_string(proposed) +
                     " proposed tokens accepted (" +
                     fmt("%.1f", proposed > 0 ? 100.0 * accepted / proposed : 0.0) + "%), " +
                     fmt("%.2f", per_step) + " tokens per decode step");
}

// Prefill at each prompt size, then decode at each length.
vlm::Status bench_text(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                       BenchReport* r) {
  for (int64_t n : p.prompts) {
    progress("prefill " + std::to_string(n) + " tokens", a);
    auto s = bench_prefill(engine, n, a);
    if (!s.ok()) return s.status().with_context("prefill " + std::to_string(n));
    r->rows.push_back({"prefill",
                       "prefill",
                       std::to_string(n) + " tokens",
                       "tok/s",
                       *s,
                       {{"size", n}, {"prompt_tokens", n}}});
  }
  for (int64_t n : p.gens) {
    if (!p.decode) break;
    progress("decode " + std::to_string(n) + " tokens after " + std::to_string(p.gen_prompt), a);
    const vlm::Engine::CoreStats before = engine.core_stats();
    auto s = bench_decode(engine, p.gen_prompt, n, a, p.gen_ids);
    if (!s.ok()) return s.status().with_context("decode " + std::to_string(n));
    // The weight stream per token (add_decode_bandwidth) holds for one token a step only.
    if (engine.core_stats().spec_tokens == 0) r->decode_rows.push_back(r->rows.size());
    json f = {{"size", n}, {"gen_tokens", n}, {"prompt_tokens", p.gen_prompt}};
    add_spec_figures(before, engine.core_stats(), n * a.reps + (a.no_warmup ? 0 : 1),
                     "decode " + std::to_string(n), &f, r);
    r->rows.push_back({"decode", "decode",
                       std::to_string(n) + " tokens after " + std::to_string(p.gen_prompt), "tok/s",
                       *s, f});
  }
  return vlm::ok_status();
}

// Each --structured grammar: its compile and mask times, then decode with and without it.
vlm::Status bench_structured(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                             BenchReport* r) {
  for (const std::string& arg : a.structured) {
    VLM_ASSIGN_OR_RETURN(const vlm::StructuredOutput so, structured_spec(arg));
    const std::string name = arg.substr(arg.find_last_of('/') + 1);
    progress("grammar " + name, a);
    VLM_RETURN_IF_ERROR(bench_grammar(engine, name, so, a, &r->rows, &r->notes));
    for (int64_t n : p.gens) {
      progress("decode " + std::to_string(n) + " tokens with and without grammar " + name, a);
      VLM_RETURN_IF_ERROR(bench_decode_structured(engine, name, so, p.gen_prompt, n, a, &r->rows));
    }
  }
  return vlm::ok_status();
}

// The images (and, in the default run, the two standard synthetic ones), then each video at each
// frame count.
vlm::Status bench_media(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                        BenchReport* r) {
  for (const ImageCase& img : p.images) {
    progress("vision " + img.name, a);
    VLM_RETURN_IF_ERROR(bench_image(engine, img, a, &r->rows));
  }
  if (p.default_run && engine.has_vision()) {
    for (const char* s : {"448x448", "1280x960"}) {
      VLM_ASSIGN_OR_RETURN(const ImageCase c, synthetic_case(s));
      progress("vision " + c.name, a);
      VLM_RETURN_IF_ERROR(bench_image(engine, c, a, &r->rows));
    }
  } else if (p.default_run) {
    r->notes.push_back("vision: not measured (the checkpoint has no vision tower)");
  }
  for (const std::string& v : a.videos) {
    for (int64_t n : p.video_frames) {
      progress("video " + v + ", " + std::to_string(n) + " frames", a);
      VLM_RETURN_IF_ERROR(bench_video(engine, v, n, a, &r->rows));
    }
  }
  return vlm::ok_status();
}

// Batched decode through the engine core at each --batch size, for each decode length; each
// row's speed-up over batch 1.
vlm::Status bench_batches(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                          BenchReport* r) {
  for (int64_t n : p.gens) {
    if (p.batches.empty() || !p.spec_cost.empty()) break;
    double single = 0;
    for (int64_t b : p.batches) {
      const std::string size = std::to_string(b) + " x " + std::to_string(n) + " tokens after " +
                               std::to_string(p.gen_prompt);
      progress("batched decode, batch " + size, a);
      BatchedDecodeOptions bo;
      bo.batch = static_cast<int>(b);
      bo.prompt_tokens = p.gen_prompt;
      bo.prompt_ids = p.gen_ids;
      bo.gen_tokens = n;
      bo.reps = a.reps;
      bo.warmup = !a.no_warmup;
      auto res = bench_batched_decode(engine, bo);
      if (!res.ok()) return res.status().with_context("batched decode " + std::to_string(b));
      std::vector<double> tok_s, first_ms;
      int64_t tokens = 0, all_tokens = 0, request_steps = 0;
      for (const auto& run : *res) {
        tok_s.push_back(run.tok_s());
        first_ms.push_back(run.first_tokens_ms);
        tokens = run.tokens;
        all_tokens += run.tokens;
        request_steps += run.request_steps;
      }
      const double median = summarize(tok_s).median;
      if (b == 1) single = median;
      json f = {{"size", b},
                {"batch", b},
                {"gen_tokens", n},
                {"prompt_tokens", p.gen_prompt},
                {"window_tokens", tokens},
                {"first_tokens_ms", first_ms}};
      if (single > 0) f["speedup_vs_batch1"] = median / single;
      if (engine.core_stats().spec_tokens > 0 && request_steps > 0) {  // per request and step
        f["tokens_per_step"] = static_cast<double>(all_tokens) / static_cast<double>(request_steps);
      }
      r->rows.push_back({"batched_decode", "batched decode", size, "tok/s", tok_s, f});
      if (b != 1 && single > 0) {
        r->notes.push_back("batched decode " + std::to_string(b) + " x " + std::to_string(n) +
                           ": " + fmt("%.2f", median / single) +
                           "x the output tok/s of 1 sequence");
      }
    }
  }
  return vlm::ok_status();
}

// --pool: pooling requests (what an embedding model runs: the prompt, no token sampled), each
// --batch of them submitted at once (1 without --batch): embeddings a second, over the time until
// the last of a round ends. Each size's requests are synthetic prompts of that many tokens, each
// its own (salted by its index, as the batched decode's); each --synthetic-image's are the
// embedder's prompt around that picture (vlm/pooling.h, its media limits), each request's BMP
// bytes salted in their last two (a pixel's, or a row's padding) so that no request of the run
// finds another's image in the vision cache. An --image file is not salted, so not pooled.
vlm::Status bench_pool(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                       BenchReport* r) {
  if (p.pool.empty()) return vlm::ok_status();
  const std::vector<int64_t> batches = p.batches.empty() ? std::vector<int64_t>{1} : p.batches;
  struct Input {
    std::string label;
    int64_t size = 0;  // text: the prompt's tokens
    const ImageCase* image = nullptr;
  };
  std::vector<Input> inputs;
  for (int64_t size : p.pool) inputs.push_back({std::to_string(size) + " tokens", size, nullptr});
  for (const ImageCase& img : p.images) {
    if (img.input.bytes.empty()) continue;  // a file: its bytes are not salted
    if (engine.tokenizer() == nullptr) {
      return vlm::not_found(
          "--pool with --synthetic-image: the embedder's prompt needs the "
          "model's tokenizer");
    }
    inputs.push_back({"embedder prompt, " + img.name, 0, &img});
  }
  int64_t salt = 0;  // every image request of the run its own
  auto request = [&](const Input& in, int64_t i) -> vlm::Result<vlm::GenerateRequest> {
    if (in.image == nullptr) {
      vlm::GenerateRequest req;
      req.prompt_ids = synthetic_prompt_ids(in.size, engine.vocab_size(), i);
      req.pooling.enabled = true;
      return req;
    }
    vlm::ImageInput im = in.image->input;
    ++salt;
    im.bytes.back() = static_cast<uint8_t>(salt);
    im.bytes[im.bytes.size() - 2] = static_cast<uint8_t>(salt >> 8);
    return vlm::embedding_request(*engine.tokenizer(), vlm::PoolingInput{"", {std::move(im)}, {}},
                                  "");
  };
  for (const Input& in : inputs) {
    double single = 0;
    for (int64_t b : batches) {
      const std::string label = std::to_string(b) + " x " + in.label;
      progress("pooling, " + label, a);
      std::vector<double> per_s;
      int64_t prompt_tokens = 0;
      for (int rep = a.no_warmup ? 0 : -1; rep < a.reps; ++rep) {
        std::vector<std::unique_ptr<vlm::RequestStream>> streams;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < b; ++i) {
          // Distinct across the rounds too (the warm-up's included).
          VLM_ASSIGN_OR_RETURN(vlm::GenerateRequest req, request(in, (rep + 1) * b + i));
          auto s = engine.submit(std::move(req));
          if (!s.ok()) return s.status().with_context("pooling " + label);
          streams.push_back(std::move(s).value());
        }
        for (auto& s : streams) {
          vlm::RequestOutput out;
          while (s->next(&out)) {
            if (!out.error.ok()) return out.error;
            if (out.finished) prompt_tokens = out.stats.prompt_tokens;
          }
        }
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep >= 0) per_s.push_back(static_cast<double>(b) / secs);
      }
      const double median = summarize(per_s).median;
      if (b == 1) single = median;
      json f = {{"size", prompt_tokens}, {"batch", b}, {"prompt_tokens", prompt_tokens}};
      if (in.image != nullptr) f["image"] = in.image->name;
      if (single > 0) f["speedup_vs_batch1"] = median / single;
      r->rows.push_back({"pool", "pooling (embeddings)", label, "emb/s", per_s, f});
    }
  }
  return vlm::ok_status();
}

// --spec-cost: the verify pass's cost. Batched decode (each --batch, the first -n steps) where
// every step carries k proposals per request (junk, so only the step's own token is kept), k = 0
// and each --spec-cost: milliseconds per engine step (the median of a round's steps), and each
// against k = 0. The requests may sample k more tokens, so that each of the n steps timed carries
// all k proposals (a request's last steps carry fewer: its budget would end inside them).
vlm::Status bench_spec_cost(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                            BenchReport* r) {
  if (p.spec_cost.empty()) return vlm::ok_status();
  std::vector<int64_t> ks{0};
  ks.insert(ks.end(), p.spec_cost.begin(), p.spec_cost.end());
  const int64_t n = p.gens[0];
  for (int64_t b : p.batches) {
    double plain = 0;
    for (int64_t k : ks) {
      g_forced_k = static_cast<int32_t>(k);
      const std::string size = "batch " + std::to_string(b) + ", " + std::to_string(k) +
                               " proposed, " + std::to_string(p.gen_prompt) + " context";
      progress("verify step, " + size, a);
      const vlm::Engine::CoreStats before = engine.core_stats();
      BatchedDecodeOptions bo;
      bo.batch = static_cast<int>(b);
      bo.prompt_tokens = p.gen_prompt;
      bo.prompt_ids = p.gen_ids;
      bo.gen_tokens = n + k;
      bo.reps = a.reps;
      bo.warmup = !a.no_warmup;
      auto res = bench_batched_decode(engine, bo);
      if (!res.ok()) return res.status().with_context("verify step " + size);
      std::vector<double> ms;
      for (const auto& run : *res) {
        std::vector<double> first(run.step_ms.begin(),
                                  run.step_ms.begin() + std::min<size_t>(run.step_ms.size(), n));
        ms.push_back(summarize(first).median);
      }
      const double median = summarize(ms).median;
      if (k == 0) plain = median;
      const vlm::Engine::CoreStats after = engine.core_stats();
      json f = {{"size", k},
                {"batch", b},
                {"proposed", k},
                {"rows_per_step", b * (k + 1)},
                {"gen_tokens", n},
                {"prompt_tokens", p.gen_prompt},
                {"spec_proposed_tokens", after.spec_draft_tokens - before.spec_draft_tokens},
                {"spec_accepted_tokens", after.spec_accepted_tokens - before.spec_accepted_tokens}};
      if (plain > 0) f["vs_plain_step"] = median / plain;
      r->rows.push_back({"spec_verify_cost", "verify step", size, "ms", ms, f});
      if (k > 0 && plain > 0) {
        r->notes.push_back("verify step, batch " + std::to_string(b) + ", " + std::to_string(k) +
                           " proposed: " + fmt("%.2f", median / plain) + "x a plain step");
      }
    }
  }
  g_forced_k = 0;
  return vlm::ok_status();
}

// Decode attention alone at each --attention context, for each KV cache dtype.
vlm::Status bench_attention(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                            BenchReport* r) {
  for (int64_t ctx : p.attention) {
    for (vlm::KvCacheDtype t :
         {vlm::KvCacheDtype::kF32, vlm::KvCacheDtype::kBF16, vlm::KvCacheDtype::kInt8}) {
      const std::string size =
          "ctx " + std::to_string(ctx) + ", " + vlm::kv_cache_dtype_name(t) + " KV";
      progress("decode attention " + size, a);
      VLM_ASSIGN_OR_RETURN(std::vector<double> ms, time_decode_attention(engine, ctx, t, a.reps));
      r->rows.push_back(
          {"decode_attention", "decode attention (all attention layers)", size, "ms", ms,
           json{{"size", ctx}, {"context", ctx}, {"kv_cache_dtype", vlm::kv_cache_dtype_name(t)}}});
    }
  }
  return vlm::ok_status();
}

// A hybrid model's Gated DeltaNet mixing alone over a prefill (the first -p, else 512 tokens) at
// each --delta-rule chunk size.
vlm::Status bench_delta_rule(vlm::Engine& engine, const BenchArgs& a, const BenchPlan& p,
                             BenchReport* r) {
  const int64_t tokens = p.prompts.empty() ? 512 : p.prompts[0];
  for (int64_t chunk : p.delta_chunks) {
    const std::string size =
        std::to_string(tokens) + " tokens, " +
        (chunk == 1 ? std::string("recurrent") : "chunk " + std::to_string(chunk));
    progress("delta rule " + size, a);
    VLM_ASSIGN_OR_RETURN(std::vector<double> ms, time_delta_rule(engine, tokens, chunk, a.reps));
    r->rows.push_back({"delta_rule", "prefill delta rule (all linear layers)", size, "ms", ms,
                       json{{"size", chunk}, {"tokens", tokens}, {"chunk", chunk}}});
  }
  return vlm::ok_status();
}

// The memory read and copy probe (with the engine's thread count when one ran).
vlm::Status bench_membw(const BenchArgs& a, BenchReport* r) {
  MemoryBandwidthOptions mo;
  mo.bytes = a.membw_mib > 0 ? a.membw_mib << 20 : 0;
  mo.n_threads = r->threads;
  mo.reps = r->membw_reps;
  const int64_t bytes = mo.bytes > 0 ? mo.bytes : default_membw_bytes();
  std::fprintf(stderr, "vlm bench: memory bandwidth, 2 x %lld MiB: %d reps\n",
               static_cast<long long>(bytes >> 20), mo.reps);
  VLM_ASSIGN_OR_RETURN(const MemoryBandwidth bw, measure_memory_bandwidth(mo));
  r->threads = bw.n_threads;
  const std::string size = std::to_string(bw.bytes >> 20) + " MiB, " +
                           std::to_string(bw.n_threads) +
                           (bw.n_threads == 1 ? " thread" : " threads");
  const json f = {{"size", bw.bytes},
                  {"bytes", bw.bytes},
                  {"threads", bw.n_threads},
                  {"l3_bytes", last_level_cache_bytes()}};
  r->rows.push_back({"membw_read", "memory read (sum)", size, "GB/s", bw.read_gb_s, f});
  r->rows.push_back({"membw_copy", "memory copy (read + write)", size, "GB/s", bw.copy_gb_s, f});
  r->read = summarize(bw.read_gb_s);
  r->copy = summarize(bw.copy_gb_s);
  return vlm::ok_status();
}

std::string bytes_text(double b) {
  return b >= 1e9 ? fmt("%.2f GB", b / 1e9) : fmt("%.2f MB", b / 1e6);
}

// Decode streams every linear weight once per token (and a hybrid model's state once per
// sequence): bytes × tok/s is its bandwidth, a row for each decode row (and its share of the
// probe's, when it ran).
void add_decode_bandwidth(bool membw, BenchReport* r) {
  const int64_t bytes = r->weight_bytes + r->state_bytes;
  for (size_t i : r->decode_rows) {
    const Row d = r->rows[i];
    std::vector<double> gb_s;
    for (double v : d.samples) gb_s.push_back(static_cast<double>(bytes) * v / 1e9);
    const double median = summarize(gb_s).median;
    json f = {{"size", d.fields.at("size")},
              {"gen_tokens", d.fields.at("gen_tokens")},
              {"prompt_tokens", d.fields.at("prompt_tokens")},
              {"weight_bytes", r->weight_bytes},
              {"state_bytes", r->state_bytes}};
    std::string note =
        "decode " + d.size + ": " + bytes_text(static_cast<double>(r->weight_bytes)) +
        fmt(" of weights (%.3f bits each)", r->bits_per_weight) +
        (r->state_bytes > 0
             ? " + " + bytes_text(static_cast<double>(r->state_bytes)) + " of f32 state"
             : std::string()) +
        " per token x " + fmt("%.2f", summarize(d.samples).median) +
        " tok/s = " + fmt("%.2f", median) + " GB/s";
    if (membw && r->read.median > 0) {
      f["share_of_read"] = median / r->read.median;
      f["share_of_copy"] = median / r->copy.median;
      note += ", " + fmt("%.0f", 100 * median / r->read.median) + "% of the read bandwidth, " +
              fmt("%.0f", 100 * median / r->copy.median) + "% of memcpy's read + write";
    }
    r->rows.push_back({"decode_bandwidth",
                       r->state_bytes > 0 ? "decode weight + state stream" : "decode weight stream",
                       d.size, "GB/s", gb_s, f});
    r->notes.push_back(note);
  }
}

// The table, notes and footer (on stdout, or stderr when the JSON goes to stdout), and the JSON.
vlm::Status write_report(const BenchArgs& a, const BenchPlan& p, const BenchReport& r) {
  const std::string commit = vlm_build_commit();
  const std::string date = utc_now();
  FILE* out = a.json_out == "-" ? stderr : stdout;
  print_table(out, r.rows);
  for (const std::string& n : r.notes) std::fprintf(out, "%s\n", n.c_str());
  std::fprintf(out, "threads %d, kernels %s, peak RSS %.1f MiB | %d rep%s%s: median, min, max%s |",
               r.threads, r.kernels.empty() ? "-" : r.kernels.c_str(), r.peak_rss / 1048576.0,
               a.reps, a.reps == 1 ? "" : "s", a.no_warmup ? "" : " after a warmup",
               p.membw ? fmt(" (memory: %.0f passes)", r.membw_reps).c_str() : "");
  std::fprintf(out, " %s | commit %s | %s\n", a.model.empty() ? "no model" : a.model.c_str(),
               commit.empty() ? "unknown" : commit.c_str(), date.c_str());
  if (a.json_out.empty()) return vlm::ok_status();
  json j = {{"tool", "vlm bench"},
            {"command", a.command},
            {"commit", commit.empty() ? json(nullptr) : json(commit)},
            {"date", date},
            {"cpu", cpu_name()},
            {"l3_bytes", last_level_cache_bytes()},
            {"reps", a.reps},
            {"warmup", !a.no_warmup},
            {"gen_prompt_tokens", p.gen_prompt},
            {"peak_rss_bytes", r.peak_rss}};
  for (auto it = r.info.begin(); it != r.info.end(); ++it) j[it.key()] = it.value();
  j["threads"] = r.threads;
  j["results"] = json::array();
  for (const Row& row : r.rows) j["results"].push_back(row_json(row));
  const std::string text = j.dump(1) + "\n";
  if (a.json_out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return vlm::ok_status();
  }
  std::ofstream f(a.json_out);
  f << text;
  if (!f) return vlm::unavailable("cannot write " + a.json_out);
  return vlm::ok_status();
}

}  // namespace

void add_bench_options(CLI::App* b, BenchArgs* a) {
  b->add_option("-m,--model", a->model,
                std::string("Checkpoint directory or GGUF file") + kModelNameHelp +
                    " (needed for all but --membw)");
  b->add_option("-p,--prompt-tokens", a->prompt_sizes,
                "Prefill sizes in tokens, a comma list (default run: 128,512,2048)");
  b->add_option("-n,--gen-tokens", a->gen_sizes,
                "Decode lengths in tokens, a comma list (default run: 128)");
  b->add_option("--gen-prompt-file", a->gen_prompt_file,
                "The decode measurements' prompt: this file's text, tokenized as is (no chat "
                "template), instead of --gen-prompt random tokens");
  b->add_option("--spec-cost", a->spec_cost,
                "The verify pass's cost: batched decode (each --batch, the first -n) with this "
                "many proposed tokens per request and step, a comma list, beside none: ms per "
                "step (--batch and -n then serve it alone)");
  b->add_option("--gen-prompt", a->gen_prompt,
                "Prompt tokens before each decode measurement (default: the first -p, else 128)");
  b->add_option("--image", a->images, "Measure the vision path on this image file; repeatable");
  b->add_option("--synthetic-image", a->synthetic_images,
                "Measure the vision path on a generated WxH image; repeatable (default run: "
                "448x448 and 1280x960 when the model has a vision tower)");
  b->add_option("--video", a->videos,
                "Measure the video path on this file (frame decode, preprocess, encode at the "
                "checkpoint's pixel budget); repeatable");
  b->add_flag("--no-video-seek", a->no_video_seek,
              "Decode every video frame up to the last sampled one (no keyframe seeking)");
  b->add_option("--video-frames", a->video_frames,
                "Sampled frames per --video measurement, a comma list (default: 8,32,128)");
  b->add_option("--min-pixels", a->min_pixels, "Resize budget of the images: least pixels");
  b->add_option("--max-pixels", a->max_pixels, "Resize budget of the images: most pixels");
  b->add_option("--batch", a->batch_sizes,
                "Batched decode through the continuous-batching engine at these concurrencies, "
                "a comma list (1 is always added as the baseline), e.g. 1,8");
  b->add_option("--pool", a->pool_sizes,
                "Pooling (what an embedding model runs: the prompt, no token): requests of these "
                "prompt lengths, each --batch of them at once (1 without --batch); embeddings a "
                "second. With --synthetic-image, also the embedder's prompt around each picture");
  b->add_option("--attention", a->attention_sizes,
                "Decode attention alone (CPU) at these context lengths, a comma list, for each "
                "KV cache dtype (f32, bf16, int8): ms per step over all layers");
  b->add_option(
      "--delta-rule", a->delta_chunks,
      "A hybrid model's Gated DeltaNet mixing alone (CPU: conv1d, gates, delta rule) over "
      "a prefill of the first -p tokens (default 512), with the delta rule in chunks of "
      "these sizes, a comma list (1: token by token): ms over all linear layers");
  b->add_flag("--membw", a->membw,
              "Measure the memory read and copy bandwidth (in the default run)");
  b->add_option("--membw-mib", a->membw_mib,
                "--membw with buffers of this many MiB (default: 4 x the L3 cache, at least 256; "
                "2048 if the L3 size is unknown)");
  b->add_option("-r,--reps", a->reps, "Repetitions of each measurement (median, min, max)");
  b->add_flag("--no-warmup", a->no_warmup, "Skip the untimed run before each measurement");
  b->add_option("-t,--threads", a->threads, "Threads (0 = all)");
  vlm::cli::add_quant_option(b, &a->quant, &a->int4_group);
  b->add_flag("--mmap", a->mmap, vlm::cli::kMmapHelp);
  b->add_flag("--vision-fp16", a->vision_fp16, vlm::cli::kVisionFp16Help);
  vlm::cli::add_mmproj_option(b, &a->device);
  vlm::cli::add_device_options(b, &a->device);
  vlm::cli::add_spec_options(b, &a->device.batching.spec);
  b->add_option("--prefill-chunk", a->device.prefill_chunk,
                "Tokens per forward pass in prefill (default 256; larger fills a GPU better)");
  b->add_option("--structured", a->structured,
                "Structured output: json_object or a JSON Schema file (repeatable): the grammar's "
                "compile time, its token-mask time per step, and decode (-n) with it beside "
                "decode without it");
  b->add_flag("--kernels", a->kernels_only,
              "Print the CPU kernel choices (each candidate's GFLOP/s at the model's shapes, or "
              "for decode its GB/s over the model's weights, and the one chosen) and stop");
  b->add_option("--json", a->json_out,
                "Also write every measurement as JSON to this file ('-': to stdout, with the "
                "table on stderr)");
}

int run_bench(const BenchArgs& a) {
  auto planned = plan_bench(a);
  if (!planned.ok()) return fail(planned.status().message());
  const BenchPlan& p = *planned;
  BenchReport r;
  r.info = {{"model", a.model.empty() ? json(nullptr) : json(a.model)},
            {"isa", nullptr},
            {"quant", nullptr},
            {"threads", nullptr},
            {"decode_weight_bytes", nullptr},
            {"decode_state_bytes", nullptr},
            {"decode_weight_count", nullptr},
            {"bits_per_weight", nullptr}};
  r.threads = a.threads;
  if (!a.model.empty() && p.needs_model) {
    auto loaded = load_engine(a, p);
    if (!loaded.ok()) return fail(loaded.status().message());
    vlm::Engine& engine = **loaded;
    if (a.kernels_only) {  // --kernels: the choice and its measurements, nothing else
      std::printf("%s\n", engine.cpu_kernels().c_str());
      return 0;
    }
    describe_engine(engine, a, &r);
    for (auto stage : {bench_text, bench_structured, bench_media, bench_batches, bench_spec_cost,
                       bench_attention, bench_delta_rule, bench_pool}) {
      if (vlm::Status st = stage(engine, a, p, &r); !st.ok()) return fail(st.message());
    }
    if (engine.device() != "cpu") {
      r.info["cuda_graph_replays"] = engine.cuda_graph_replays();
      r.notes.push_back("forward passes replayed from CUDA graphs: " +
                        std::to_string(engine.cuda_graph_replays()));
    }
  }
  r.peak_rss = peak_rss_bytes();       // before the probe, whose buffers would count
  r.membw_reps = std::max(a.reps, 5);  // cheap (well under a second a pass) and noisy
  if (p.membw) {
    if (vlm::Status st = bench_membw(a, &r); !st.ok()) return fail(st.message());
  }
  add_decode_bandwidth(p.membw, &r);
  if (vlm::Status st = write_report(a, p, r); !st.ok()) return fail(st.message());
  return 0;
}

}  // namespace vlm_cli
