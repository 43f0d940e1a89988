// `vlm bench`: prefill, decode, vision, batched-decode and memory-bandwidth figures, each the
// median, min and max of repetitions after a warmup, as a markdown table and JSON.
// Methodology: docs/benchmarks.md.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "vlm/engine.h"

namespace vlm_cli {

struct BenchArgs {
  std::string model;
  std::string prompt_sizes;     // -p "128,512,2048"; "" = not given
  std::string gen_sizes;        // -n "128"
  std::string batch_sizes;      // --batch "1,8"
  std::string attention_sizes;  // --attention "4096,16384"
  std::string delta_chunks;     // --delta-rule "16,32,64,128"
  std::string pool_sizes;       // --pool "64": pooling requests (embeddings) of these lengths
  int64_t gen_prompt = 0;       // prompt before the decode measurements; 0 = the first -p, else 128
  std::string gen_prompt_file;  // --gen-prompt-file: that text (tokenized, no template) instead
  std::string spec_cost;        // --spec-cost "1,2,4,8": verify steps with that many proposals
  std::vector<std::string> images;
  std::vector<std::string> synthetic_images;  // "448x448"
  int64_t min_pixels = -1, max_pixels = -1;
  std::vector<std::string> videos;  // --video FILE
  std::string video_frames;         // --video-frames "8,32,128"
  bool no_video_seek = false;       // --no-video-seek
  int reps = 3;
  bool no_warmup = false;
  int threads = 0;
  vlm::Quant quant = vlm::Quant::kNone;
  int64_t int4_group = vlm::kInt4DefaultGroupSize;
  bool mmap = false;
  bool vision_fp16 = false;
  vlm::EngineOptions device;  // --device and the GPU options
  bool membw = false;
  int64_t membw_mib = 0;      // 0 = default_membw_bytes()
  std::string json_out;       // a file, or "-" for stdout (the table then goes to stderr)
  bool kernels_only = false;  // --kernels
  // --structured: "json_object" or a JSON Schema file, repeatable: grammar compile time, token
  // mask time per step, and decode with the grammar beside decode without it.
  std::vector<std::string> structured;
  std::string command;  // the command line, recorded in the JSON
};

// Declares the `bench` options on `cmd`, writing into `a`.
void add_bench_options(CLI::App* cmd, BenchArgs* a);

// Runs the benchmark; returns the process exit code (errors: one line on stderr, 1).
int run_bench(const BenchArgs& a);

}  // namespace vlm_cli
