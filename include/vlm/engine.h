// vlm public API: load a Qwen3-VL checkpoint directory and run it.
// Every request runs through the Engine's one engine core (continuous batching on its own
// thread): chat, chat_stream, submit, generate and logits may be called from many threads at
// once, and their
// requests share the core's forward passes.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/chat.h"
#include "vlm/request.h"
#include "vlm/status.h"
#include "vlm/tokenizer.h"

namespace vlm {

// Where the model runs.
enum class Device { kCpu, kCuda };
// Weight quantization done at load time (EngineOptions::quant).
enum class Quant { kNone, kInt8, kInt4, kFp8 };
// Inputs per f16 scale of --quant int4 unless EngineOptions::int4_group says otherwise.
inline constexpr int64_t kInt4DefaultGroupSize = 32;
// The GPU's weights and activations (EngineOptions::gpu_dtype).
enum class GpuDtype { kBF16, kF32 };
// The arithmetic the CPU may use (EngineOptions::precision): kAuto follows what the reference
// does for the checkpoint's dtype (a BF16 checkpoint may multiply in BF16 where that is faster);
// kF32 keeps every product exact in f32 (what the parity tests compare).
enum class Precision { kAuto, kF32 };
// What the KV cache stores (EngineOptions::kv_cache_dtype). kAuto: BF16 on the CPU when the
// checkpoint's weights are BF16 (else f32); on the GPU the activation type. kInt8: one f32 scale
// per token and KV head (CPU only).
enum class KvCacheDtype { kAuto, kF32, kBF16, kInt8 };
// The CPU's matmul kernel level (EngineOptions::cpu_isa, Engine::cpu_isa): kAuto is the best
// this CPU runs (capped by the VLM_CPU_ISA environment variable); a forced level the CPU cannot
// run is refused.
enum class CpuIsa { kAuto, kGeneric, kAvx2, kAvx2Vnni, kAvx512, kAvx512Vnni };
// How the CPU multiplies BF16 weights in the prefill and vision products (EngineOptions::
// bf16_gemm): kAuto follows the VLM_CPU_KERNELS environment variable ("bf16_gemm=f32|dpbf16|amx"),
// else what a measurement at load finds fastest (see `precision` and `autotune`); kF32 widens to
// f32 (exact); kDpbf16 AVX-512 BF16 dot products; kAmx AMX tiles.
enum class Bf16Gemm { kAuto, kF32, kDpbf16, kAmx };

// The spellings a command line or a configuration file uses, parsed once where the text comes in:
// "cpu" | "cuda"; "none" | "int8" | "int4" | "fp8"; "bf16" | "f32"; "auto" | "f32"; "auto" |
// "f32" | "bf16" | "int8"; "auto" | "generic" | "avx2" | "avx2vnni" | "avx512" | "avx512vnni";
// "auto" | "f32" | "dpbf16" | "amx". InvalidArgument naming the accepted values otherwise.
const char* device_name(Device d);
const char* quant_name(Quant q);
const char* gpu_dtype_name(GpuDtype t);
const char* precision_name(Precision p);
const char* kv_cache_dtype_name(KvCacheDtype t);
const char* cpu_isa_name(CpuIsa isa);
const char* bf16_gemm_name(Bf16Gemm g);
Result<Device> parse_device(std::string_view name);
Result<Quant> parse_quant(std::string_view name);
Result<GpuDtype> parse_gpu_dtype(std::string_view name);
Result<Precision> parse_precision(std::string_view name);
Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view name);
Result<CpuIsa> parse_cpu_isa(std::string_view name);
Result<Bf16Gemm> parse_bf16_gemm(std::string_view name);

// What this build of vlm holds and what this machine runs of it (`vlm --version`).
struct SystemInfo {
  std::string version;                       // the library's version
  std::vector<std::string> isas_built;       // CPU kernel levels compiled in (cpu_isa_name's)
  std::vector<std::string> isas_runnable;    // those this CPU runs, lowest first
  std::string isa_auto;                      // what kAuto picks here (VLM_CPU_ISA may cap it)
  std::vector<std::string> extras_built;     // "avx512bf16", "amx" (BF16 GEMMs), "avx512fp16"
  std::vector<std::string> extras_runnable;  // those this CPU (and OS, for AMX) runs
  bool cuda_built = false;                   // the CUDA backend compiled in (--device cuda)
};
SystemInfo system_info();

// KV events: every change to the prefix cache's set of blocks, in the terms of vLLM's KV events
// (vllm/distributed/kv_events.py), for a KV-aware router's index of which replica holds which
// prefix. `vlm serve` publishes them over ZeroMQ (ServeOptions::kv_events); an embedder receives
// them through BatchingOptions::on_kv_events.
struct KvEvent {
  enum class Kind { kBlockStored, kBlockRemoved, kAllBlocksCleared };
  Kind kind = Kind::kBlockStored;
  // Each block's hash as vLLM publishes it: the low 64 bits of the chained SHA-256 (its last 8
  // bytes, big-endian).
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;  // stored: the block before the first, if any
  std::vector<int32_t> token_ids;             // stored: block_size ids per block
  // Stored: per block, the SHA-256 (hex) of every image whose tokens it covers (empty: none).
  std::vector<std::vector<std::string>> extra_keys;
};
struct KvEventBatch {
  double ts = 0;  // seconds since the Unix epoch
  int32_t block_size = 0;
  std::vector<KvEvent> events;
};

// Speculative decoding (docs/architecture.md, "Speculative decoding"): each step a decoding
// request may carry up to num_tokens proposed tokens, which one forward pass verifies; the output
// is the plain output (greedy) or distributed exactly as it (sampling). kNgram: prompt lookup (the
// longest suffix of ngram_max down to ngram_min tokens found earlier in the prompt or output
// proposes the tokens that followed it). kDraft: a smaller model with the same tokenizer
// (draft_model, loaded with the target's options) proposes its greedy continuation, one batched
// pass per proposed position; it runs the request's images and videos through its own vision
// tower and keeps its own KV cache, sized with the target's out of the same budget. kMtp:
// Qwen3.5's own multi-token-prediction head (the checkpoint's mtp.* layer, loaded only then)
// proposes from the target's last hidden state, chained for K > 1; its KV is one more attention
// layer beside the target's blocks, out of the same budget. kCustom:
// `propose` (called on the engine thread; must not block) is given the sequence's ids so far
// (prompt, then output), the prompt's length and at most how many to propose, writes up to that
// many ids to `out` and returns how many.
enum class SpecMethod { kNone, kNgram, kDraft, kMtp, kCustom };
const char* spec_method_name(SpecMethod m);
// "none" | "ngram" | "draft" | "mtp"
Result<SpecMethod> parse_spec_method(std::string_view name);
struct SpecOptions {
  static constexpr int32_t kMaxTokens = 16;
  SpecMethod method = SpecMethod::kNone;
  int32_t num_tokens = 4;  // K: tokens proposed per step at most, 1..kMaxTokens
  int32_t ngram_min = 2, ngram_max = 4;
  std::string draft_model;  // kDraft: the draft checkpoint's directory
  // true: a request's proposals per step are capped by how its last verify went (halved when
  // none was accepted, down to 0 for a while; doubled when all were). false: every step asks for
  // num_tokens whatever was accepted (measurements of the verify pass's cost).
  bool adaptive = true;
  std::function<int32_t(std::span<const int32_t> ids, int64_t prompt_len, int32_t max_k,
                        int32_t* out)>
      propose;
};

// The engine core: the per-step limits, the paged KV cache and the queue. Every request runs
// through it (Engine::chat, chat_stream, submit, generate, logits).
struct BatchingOptions {
  int32_t block_size = 16;
  // 0: max_num_seqs × the full context, on the CPU capped at 4 GiB of f32 K and V but never below
  // one sequence at the full context (reserved at load, resident as blocks are first written),
  // on "cuda" at EngineOptions::gpu_memory_utilization of the GPU's memory.
  int32_t num_blocks = 0;
  // With num_blocks 0 on the CPU: the KV cache's size in bytes (K, V and INT8 scales of every
  // layer) instead of the cap above (0: that cap).
  int64_t kv_cache_memory = 0;
  int64_t max_num_seqs = 16;
  int64_t max_batched_tokens = 0;  // tokens per step; 0: the prefill chunk (at most that)
  int64_t max_waiting = 256;       // queued (not yet running) requests; beyond: ResourceExhausted
  int64_t vision_cache_mib = 512;  // vision-encoder outputs kept for images that come back
  // Decoded image pixels (width × height) in flight at once across the threads that submit
  // requests: an image whose header would take the total past this waits until others are
  // preprocessed (one larger than the whole budget goes alone). 0: no limit. The default holds
  // two 50-megapixel photos.
  int64_t max_inflight_image_pixels = 100'000'000;
  // When a request arrives at an idle engine, wait up to this long for others to arrive so they
  // prefill together (0: start at once).
  int64_t batch_wait_ms = 0;
  // Automatic prefix caching: full KV blocks are kept by content (a chained SHA-256 of their token
  // ids and images) after their requests end, and a request starts after the longest run of its
  // blocks found cached; least recently used ones are evicted when blocks are needed.
  bool prefix_caching = true;
  // A hybrid model's (Qwen3.5) prefix caching keeps its linear-attention state at multiples of
  // state_snapshot_interval tokens where a step's chunk ends (a prefill chunk ends at the furthest
  // one it reaches; a multiple of block_size; 0: the default, 64 rounded up to a multiple of
  // block_size), in at most state_snapshots snapshots (0: max_num_seqs), least recently used ones
  // replaced (past its prompt a request keeps only its latest); a hit resumes from the longest
  // cached prefix that ends at a snapshot. Each snapshot is one sequence's state (about 50 MB for
  // the 9B shape); with kv_cache_memory the slots and snapshots come out of it first (otherwise
  // they are reserved beside the K/V). The KV events report blocks as always: a hybrid model's hit
  // also needs a snapshot, so a router that counts cached blocks overestimates its hits.
  int64_t state_snapshot_interval = 0;
  int32_t state_snapshots = 0;
  // Called on the engine thread after a step that changed the prefix cache's set of blocks, with
  // those changes in order (needs prefix_caching, else the load fails); must not block.
  std::function<void(KvEventBatch)> on_kv_events;
  // While requests are running, an image's vision-tower pass is sliced (down to row blocks of
  // one layer's products and attention), and each step runs about this many milliseconds of it
  // beside the decode batch, so running streams keep their pace; the image's prefill starts with
  // the step that finishes it. The budget holds prefill chunks too: beside running decodes, a
  // step's encode slices and prefill chunks together take about this long (prefills of admitted
  // requests first; a chunk sized from the measured time of a prompt token, at least 16 tokens
  // or the rest of its prompt; chunked prefill only). 0: auto, one decode-only forward pass (a
  // moving average) while at most one request waits for side work, 0.75 of a pass per waiting
  // request beyond, at most 3 passes; negative: never sliced (whole encodes and prefills inside
  // one step). With no request running an encode is never sliced, and with no request decoding
  // a prefill is not held back. The outputs are the same bit for bit.
  double max_encoder_ms = 0;
  SpecOptions spec;  // speculative decoding (off by default)
};

struct EngineOptions {
  // config.json + *.safetensors (+ tokenizer.json, generation_config.json), or a GGUF model file
  // (llama.cpp's format; its tokenizer and chat template inside it).
  std::string model_dir;
  // With a GGUF model file: its vision tower's GGUF file (llama.cpp's mmproj); "" = text only.
  std::string mmproj;
  int n_threads = 0;            // 0 = all hardware threads
  int64_t max_context = 0;      // KV cache limit in tokens; 0 = the model's max_position_embeddings
  int64_t prefill_chunk = 256;  // tokens per forward pass during prefill
  bool require_tokenizer = true;  // false: a directory without tokenizer.json is fine (logits)
  // The engine only pools (an embedding server): requests that generate (or ask for prompt
  // logits) are refused, and an untied checkpoint may lack lm_head.weight, as an embedding
  // model's may (the embedding table then stands in for a head nothing reads, and pooling
  // requests that ask for logits are refused too).
  bool pooling_only = false;
  // Engine::chat's template: "" = the checkpoint's own (ChatTemplate::from_model_dir), else a
  // .jinja file or a .json file with "chat_template". Loaded with the tokenizer; one that does not
  // parse or render makes Engine::chat_template() and chat() fail with its error (the load does
  // not: raw ids and logits need no template).
  std::string chat_template;
  CpuIsa cpu_isa = CpuIsa::kAuto;
  // Weight quantization done at load time: kNone = weights as stored; kInt8 = the text decoder's
  // linear weights (q/k/v/o, gate/up/down, lm_head) as INT8 with one f32 scale per output row;
  // kInt4 = the same weights as INT4 with one f16 scale per int4_group inputs (4.5 bits per
  // weight at 32; every input dimension must be a multiple of it, as in all Qwen3-VL models; CPU
  // only). Either in memory the engine owns. The embedding lookup and the vision tower stay as
  // stored. kFp8: see `device`.
  Quant quant = Quant::kNone;
  // kInt4's group size: 32 (4.5 bits per weight), 64 (4.25) or 128 (4.125); anything else, or a
  // value other than 32 without kInt4, is refused.
  int64_t int4_group = kInt4DefaultGroupSize;
  // false (default): the matmul weights the engine uses as stored are copied at load onto 2 MiB
  // pages it owns (8-17% faster prefill and decode than 4 KiB page-cache pages; see
  // core/huge_page_buffer.h), and the file pages are released. true: they are served straight
  // from the file mapping — faster start-up, and the page cache is shared with other processes.
  bool mmap_weights = false;
  // true: the vision encoder's matmuls run in FP16 arithmetic where the CPU has AVX-512 FP16
  // (x, the weights and each run of 32 products rounded to FP16, the runs summed in f32; twice
  // the multiply rate of f32 FMA; see kernels/cpu/matmul.h). Ignored elsewhere (vision_fp16()
  // says which).
  bool vision_fp16 = false;
  // Videos: jump to the keyframe before each sampled frame where the samples lie far apart
  // (false: decode every frame up to the last sampled one; the frames are the same).
  bool video_seek = true;
  // kAuto (default): with BF16 weights as stored, the CPU's prefill and vision products may run in
  // BF16 arithmetic (x rounded to BF16; AMX tiles) where a measurement at load finds that faster
  // (autotune), and decode may round x to BF16 (BF16 weights) or INT8 (INT8 weights) where that
  // measures 5% faster than the exact decode kernels. kF32: every product in f32, as before.
  Precision precision = Precision::kAuto;
  // false: no measurement at load; the exact f32 GEMM and the default decode kernels, unless
  // forced (bf16_gemm, VLM_CPU_KERNELS).
  bool autotune = true;
  // Forces the BF16 products' kernels (kAuto: the VLM_CPU_KERNELS environment variable, else the
  // autotuned choice). One this CPU cannot run, or that contradicts precision kF32, is refused
  // (InvalidArgument); precision kF32 also overrides VLM_CPU_KERNELS' bf16_gemm. The variable's
  // decode choices ("int4_decode=r8_l2", ...; see the README) apply under every precision, and
  // one that is not exact is refused under kF32, as is a variable that does not parse.
  Bf16Gemm bf16_gemm = Bf16Gemm::kAuto;
  // Where the model runs: the CPU (default) or kCuda (the first NVIDIA GPU; only in builds with
  // the CUDA backend, else InvalidArgument). On kCuda the text decoder and the vision tower
  // run on the GPU, the weights uploaded once and the KV cache in GPU memory; images are decoded
  // and resized on the CPU, normalised and patchified on the GPU. kInt8 runs there as
  // weight-only INT8 (BF16 or F32 activations); kInt4 is CPU-only; kFp8 (GPU only, BF16) runs the
  // layers' products in E4M3 on the tensor cores, weights and activations with one scale per
  // tensor.
  Device device = Device::kCpu;
  // kCuda: weights and activations in BF16 (default, as transformers runs in bfloat16) or F32
  // (every product and activation in f32, to compare against float32 references).
  GpuDtype gpu_dtype = GpuDtype::kBF16;
  // "cuda": the share of the GPU's memory the process may take (weights, scratch and the KV
  // cache); `vlm serve` sizes its KV cache to it unless BatchingOptions::num_blocks is set.
  double gpu_memory_utilization = 0.9;
  // "cuda": decode steps (one new token per sequence) are captured as CUDA graphs, one per
  // batch-size bucket, and replayed (false: every kernel launched each step).
  bool cuda_graphs = true;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  BatchingOptions batching;
  // Called on the engine thread after every step that ran the model, with its wall time in
  // seconds (e.g. a step-time histogram); must not block.
  std::function<void(double seconds)> on_step;
  // Called on the engine thread after every step that ran part of an image encode, with the
  // units (slices) it ran and their wall time in seconds; must not block.
  std::function<void(int64_t slices, double seconds)> on_encode;
};

class OutputProcessor;
class ChatOutputParser;

// The results of one request submitted to the engine (Engine::submit), piece by piece. Pieces are
// made on the consuming thread: detokenizing, stop strings and logprob entries happen in next()
// / try_next(), never on the engine thread. One consumer at a time; cancel() may come from any
// thread.
class RequestStream {
 public:
  ~RequestStream();  // cancels the request if it has not finished
  int64_t id() const;
  // The most tokens the request may sample (GenerateRequest::max_new_tokens as resolved at
  // submit).
  int64_t max_new_tokens() const;
  // The next piece; blocks until the engine has produced it. False once the final piece has been
  // returned, or after cancel().
  bool next(RequestOutput* out);
  // The same without waiting: false when no piece is ready now.
  bool try_next(RequestOutput* out);
  // Stops the request (e.g. the client went away): its KV blocks are freed at the engine's next
  // step and no further piece comes.
  void cancel();

 private:
  friend struct EngineAccess;
  struct State;  // shared with the engine thread
  RequestStream(std::shared_ptr<State> state, std::unique_ptr<OutputProcessor> processor);
  bool take(RequestOutput* out, bool wait);
  std::shared_ptr<State> state_;
  std::unique_ptr<OutputProcessor> proc_;
  int64_t consumed_ = 0;  // tokens taken from the state
  bool done_ = false;     // the final piece was returned, or the stream was cancelled
};

// A chat request's reply (Engine::chat_stream), piece by piece: the request's stream with its text
// split into reasoning, content and tool calls on the consuming thread. One consumer at a time;
// cancel() may come from any thread.
class ChatStream {
 public:
  ~ChatStream();  // cancels the request if it has not finished
  int64_t id() const;
  // The next piece; blocks until the engine has produced it. False once the final piece has been
  // returned, or after cancel().
  bool next(ChatChunk* out);
  // The same without waiting: false when no piece is ready now.
  bool try_next(ChatChunk* out);
  void cancel();

 private:
  friend class Engine;
  ChatStream(std::unique_ptr<RequestStream> stream, std::unique_ptr<ChatOutputParser> parser,
             bool keep_reasoning);
  bool take(ChatChunk* out, bool wait);
  std::unique_ptr<RequestStream> stream_;
  std::unique_ptr<ChatOutputParser> parser_;
  bool keep_reasoning_ = true;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  ~Engine();

  // The tokenizer from the model directory; null when it has none (require_tokenizer=false).
  const Tokenizer* tokenizer() const;
  int64_t vocab_size() const;
  int64_t max_context() const;
  // True when the checkpoint has a vision tower (images accepted).
  bool has_vision() const;
  // eos ids from generation_config.json (else the tokenizer's eos token).
  const std::vector<int32_t>& eos_token_ids() const;
  // The matmul kernels' ISA level in use (never kAuto).
  CpuIsa cpu_isa() const;
  // Whether the vision encoder runs FP16 arithmetic (EngineOptions::vision_fp16 on a CPU that
  // has it).
  bool vision_fp16() const;
  // The weight quantization in use.
  Quant quant() const;
  // A pre-quantized checkpoint's format as its config.json names it ("compressed-tensors
  // pack-quantized int4 (group 32)", "Qwen FP8 e4m3 (128×128 blocks)"), or "" for one stored in
  // full precision (or a GGUF file).
  std::string checkpoint_quantization() const;
  // The CPU kernel choices and how they were made, e.g. "bf16_gemm: f32 410.2 GFLOP/s, amx 1650.3
  // GFLOP/s -> amx (cached; M=256 K=2048 N=4096); bf16_decode: widen 31.2 GB/s, ... -> evenodd_l2
  // (measured; ...)", or "bf16_gemm: f32 (--precision f32); ...".
  const std::string& cpu_kernels() const;
  // The choices alone, the same on every start that makes them: "bf16_gemm=amx,
  // vision_gemm=amx,bf16_decode=evenodd_l2" (the families the model has; empty on a GPU).
  const std::string& cpu_kernel_choice() const;
  // What the load did that its user should hear once (a GGUF file's types dequantized, the
  // defaults it took for what the file does not store); empty for most checkpoints.
  const std::vector<std::string>& load_notes() const;
  // Where the text decoder runs: "cpu", or the GPU as "NVIDIA <name> (sm_<cc>, <memory> GiB),
  // bf16".
  std::string device() const;
  // On "cuda": the GPU's utilisation (-1 when the driver does not report it) and memory in use
  // and in total (bytes, every process), from NVML. False on the CPU or without NVML.
  struct GpuStats {
    double utilization_percent = -1;
    int64_t memory_used = 0, memory_total = 0;
    double power_watts = -1;  // -1: not reported
  };
  bool gpu_stats(GpuStats* out) const;
  // Forward passes replayed from CUDA graphs so far (0 on the CPU).
  int64_t cuda_graph_replays() const;
  int n_threads() const;
  // Bytes of weights one decode step streams from memory: the text decoder's linear weights
  // (q/k/v/o, gate/up/down, lm_head) as held, i.e. after --quant (quantized data + scales).
  // Decode is memory-bound, so this × tok/s is the bandwidth it achieves (`vlm bench`).
  int64_t decode_weight_bytes() const;
  // How many weights those bytes hold: decode_weight_bytes() · 8 / this = bits per weight,
  // scales included (BF16 16, --quant int8 ~8.0, int4 4.5 with its groups of 32).
  int64_t decode_weight_count() const;
  // Bytes of linear-attention state (Qwen3.5: every linear layer's f32 recurrent state and conv
  // window) a decode step reads and rewrites per sequence; 0 for a model without linear layers.
  // `vlm bench` counts them in the decode stream beside the weights.
  int64_t decode_state_bytes() const;

  // Logits [ids.size(), vocab_size()] (row-major) for a raw id sequence, from a fresh cache: a
  // request through the engine core that also samples the token after the prompt, so at most
  // max_context() - 1 ids.
  Result<std::vector<float>> logits(std::span<const int32_t> ids);

  // With images: `ids` hold a single image pad per image (as the chat template renders it); the
  // engine expands them. Returns logits for every position of the expanded sequence and, in
  // `expanded_ids` when given, that sequence.
  Result<std::vector<float>> logits(std::span<const int32_t> ids,
                                    const std::vector<ImageInput>& images,
                                    std::vector<int32_t>* expanded_ids = nullptr);
  struct LogitsOptions {
    std::vector<int32_t>* expanded_ids = nullptr;
    // Read the prefix cache: the leading positions found there are not computed and their rows
    // stay 0; *cached_tokens (when given) says how many. Otherwise every row is computed.
    bool read_prefix_cache = false;
    int64_t* cached_tokens = nullptr;
    // One per <|vision_start|><|video_pad|><|vision_end|> of `ids` (each group's timestamp text
    // and pads are expanded by the engine).
    std::vector<VideoInput> videos;
  };
  Result<std::vector<float>> logits(std::span<const int32_t> ids,
                                    const std::vector<ImageInput>& images,
                                    const LogitsOptions& options);

  // Queues a request for the engine core and returns its stream. Runs on the caller's thread:
  // validation, and reading, decoding and preprocessing the images (or finding them in the vision
  // cache), so a bad request, one over the context or a full queue (ResourceExhausted) is an
  // error here. `notify`, when set, is called on the engine thread whenever new pieces are ready
  // (it must not block: an event-driven consumer schedules try_next() on its own thread). It may
  // be called until the request has ended, or the Engine is destroyed, even after cancel() or the
  // stream's destruction: what it touches must live that long. A stream may outlive the Engine;
  // a request the Engine did not finish then ends with an error (kUnavailable).
  Result<std::unique_ptr<RequestStream>> submit(GenerateRequest request,
                                                std::function<void()> notify = {});

  // The ids the engine would prefill for `request`, without queueing it (/tokenize): its prompt
  // with each image's pad expanded to the image's tokens and each video's placeholder to its
  // groups' timestamps and tokens, as submit() expands them (so their count is the reply's
  // prompt_tokens). Reads, decodes and preprocesses the media (or finds them in the vision
  // cache) on the caller's thread; errors as submit()'s for the prompt and its media, and
  // InvalidArgument when the expanded prompt is longer than the context.
  Result<std::vector<int32_t>> prompt_tokens(GenerateRequest request) const;
  // The same for a conversation, rendered as chat_stream() renders it (errors name the field
  // "messages" unless they name another).
  Result<std::vector<int32_t>> chat_prompt_tokens(ChatRequest request) const;

  // The chat template Engine::chat renders with; an error without a tokenizer, or the template's
  // own error when it does not parse or render (then chat and chat_stream fail with it too).
  Result<const ChatTemplate*> chat_template() const;

  // Queues a conversation (ChatRequest) and returns its stream: the messages rendered with the
  // chat template and tokenized, the media of their parts decoded and preprocessed, all on the
  // caller's thread as submit() does (`notify` as there). InvalidArgument when the template
  // refuses the conversation (the message starts "messages: "), or the request asks for a
  // thinking budget of a model without </think>; then submit()'s errors.
  Result<std::unique_ptr<ChatStream>> chat_stream(ChatRequest request,
                                                  std::function<void()> notify = {});
  // The whole reply (chat_stream to its end). on_chunk sees each piece as it comes; returning
  // false stops the request (its finish reason stays kNone).
  Result<ChatReply> chat(ChatRequest request,
                         const std::function<bool(const ChatChunk&)>& on_chunk = {});

  // Generates a reply (submit, then the stream to its end). on_token is called for each sampled
  // token with the newly complete text; returning false stops generation (finish reason stays
  // kNone).
  Result<GenerateResult> generate(const GenerateRequest& request,
                                  const std::function<bool(const TokenEvent&)>& on_token = {});

  // The engine core's state, for metrics and tests.
  struct CoreStats {
    int64_t running = 0, waiting = 0, kv_blocks_used = 0, kv_blocks_total = 0, steps = 0,
            preemptions = 0;
    int64_t kv_block_size = 0, kv_cache_bytes = 0;  // tokens per block; K, V and scales in bytes
    KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;  // kF32, kBF16 or kInt8 once loaded
    // Images decoding: the most decoded pixels in flight at once, and images that waited.
    int64_t image_pixels_peak = 0, image_pixel_waits = 0;
    int64_t vision_cache_hits = 0, vision_cache_misses = 0, vision_cache_entries = 0;
    int64_t vision_cache_bytes = 0;
    // Prefix caching: prompt tokens looked up and found (requests that read the cache), blocks
    // holding cached contents now, and blocks evicted so far.
    int64_t prefix_cache_queries = 0, prefix_cache_hits = 0, prefix_cache_blocks = 0;
    int64_t prefix_cache_evictions = 0;
    bool prefix_caching = false;  // on
    // A hybrid model's (Qwen3.5) linear-attention state: slots (one per running sequence) and
    // the bytes of one; snapshots for the prefix cache (held now, their number and interval, and
    // those replaced so far); 0 for other models.
    int64_t state_slots = 0, state_slot_bytes = 0;
    int64_t state_snapshots = 0, state_snapshot_interval = 0, state_snapshots_held = 0;
    int64_t state_snapshot_evictions = 0;
    // Every state the engine holds, in bytes: the slots and snapshots above, and with
    // speculative decoding each slot's states after a verify row's tokens (K more per slot) and a
    // hybrid draft model's states.
    int64_t state_memory_bytes = 0;
    // Speculative decoding (vLLM's spec_decode counters): proposals verified (one per request
    // and step that carried any), tokens proposed, tokens accepted, and acceptances at each
    // position (the first proposed token, the second, ...); spec_tokens is K (0: off).
    int64_t spec_tokens = 0, spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
    std::array<int64_t, SpecOptions::kMaxTokens> spec_accepted_per_pos{};
  };
  CoreStats core_stats() const;
  // When the engine loop last finished a step or an idle wait (it wakes at least every second):
  // a loop that stops beating is stuck.
  std::chrono::steady_clock::time_point last_heartbeat() const;
  // Blocks until no request is queued or running.
  void wait_idle();

 private:
  friend struct EngineAccess;  // the engine's own sources (src/engine/engine_access.h)
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlm
