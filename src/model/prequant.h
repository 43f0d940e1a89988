// Pre-quantized checkpoints: a safetensors checkpoint whose config.json carries a
// `quantization_config` — Qwen's own FP8 (`quant_method: fp8`, E4M3 weights with one inverse scale
// per 128 × 128 block) or llm-compressor's `compressed-tensors` (`pack-quantized` 4- or 8-bit
// integers packed into int32 words, `int-quantized` / `naive-quantized` int8 weights,
// `float-quantized` FP8 weights; tensor, channel, group or block scales; optional zero points),
// or GPTQ's and AWQ's (`quant_method: gptq`: 4- or 8-bit integers packed along the input in
// `qweight`, `qzeros` packed along the output — stored minus one in the v1 `gptq` format —,
// `scales` [groups, N], `g_idx` [K]; `quant_method: awq`: 4-bit, `qweight` / `qzeros` packed along
// the output in AWQ's GEMM order).
//
// The config is parsed and checked (parse_prequant_config): every method, format, bit width,
// strategy or activation setting vlm does not run is refused naming the field and its value.
// open_prequant_store then turns the checkpoint's store into one the loaders read unchanged: each
// quantized linear's tensors (weight / weight_packed with weight_scale[_inv], weight_zero_point,
// weight_shape, weight_g_idx; GPTQ / AWQ: qweight, qzeros, scales, g_idx) become one
// `<module>.weight` tensor, streamed module by module from the mapping (each module's source pages
// released once converted); everything else stays a view into the files.
//
// Which modules are quantized: the tensors decide (a `weight_packed` or `qweight`, an F8_E4M3 or
// I8 `weight` with its scale); the ignore list (GPTQ: the "-:" dynamic rules) checks — a module it
// names that holds quantized tensors is a load error naming both. A linear stored in BF16 / F32
// that the list does not name loads as stored (Qwen's FP8 checkpoints list only lm_head and the
// embedding, and keep the vision tower and the routers in BF16).
//
// Two layouts:
// - kExact (--precision f32): every quantized weight dequantized to f32 exactly as its format
//   defines it: (q − zero) · scale for integers, e4m3 · scale for FP8 (Qwen's weight_scale_inv is
//   multiplied, despite its name; edge blocks are partial).
// - kFast (the CPU's default): the weights stay about as small as they came.
//     4-bit integers → DType::kI4 (groups of 32, 64 or 128; a larger group, or a channel / tensor
//       scale, repeated over groups of 128, 64 or 32 that divide it), the scales rounded to f16
//       (a note counts those that are not exactly an f16), zero points as Int4Params::zero.
//     8-bit integers (channel or tensor scales, symmetric) → DType::kI8 with f32 row scales;
//       with groups of a multiple of 32 (GPTQ, symmetric) → Q8_0 (d the group's scale).
//     Activation order (GPTQ's g_idx, compressed-tensors' weight_g_idx, not k / group): the
//       columns reordered so that the groups are contiguous, the order in TensorView::in_perm
//       (the CPU linear gathers x so).
//     Zero points that are all 2^(bits − 1) (GPTQ / AWQ store them for symmetric schemes too) are
//       dropped.
//     FP8 (block, channel, tensor or group scales) → GGUF's Q8_0 (32 int8 and one f16 scale d;
//       the CPU's block kernels run it at every ISA level): d = s · 2^(E − 6) for the 32 values'
//       largest exponent E and their scale s, so q = e4m3 / 2^(E − 6) is exact for every value
//       within 4 binades of the largest and rounded to the nearest integer below that (each weight
//       within d / 2 ≤ max|w| / 128 of its value in its group of 32), d rounded to f16 (2^-11
//       relative) when s · 2^(E − 6) is not an f16 (fewer bits below f16's normal range, which a
//       note counts). 8.5 bits per weight.
//   A quantized weight the decoder does not multiply as a linear (the vision tower's, a router's,
//   the embedding's) and one whose shape the fast layout cannot hold (an FP8 row, block or group
//   not a multiple of 32 columns; a 4-bit group or row that none of 32, 64, 128 divides; 8-bit
//   integers with zero points; activation-ordered groups not all group_size long) is dequantized
//   to f32 as in kExact, with a note.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "vlm/status.h"

namespace vlm {

enum class PrequantMethod {
  kNone,
  kFp8,                // Qwen / DeepSeek block FP8 (quant_method "fp8")
  kCompressedTensors,  // llm-compressor (quant_method "compressed-tensors")
  kGptq,               // GPTQ (quant_method "gptq": GPTQModel, AutoGPTQ, optimum)
  kAwq,                // AWQ's GEMM packing (quant_method "awq": AutoAWQ, GPTQModel)
};

// One compressed-tensors config group (its weights' arguments and format); kFp8's one group is a
// float 8-bit block scheme.
struct PrequantScheme {
  // pack-quantized, int-quantized, naive-quantized, float-quantized; gptq, awq
  std::string format;
  std::vector<std::string> targets;  // "Linear" or "re:<pattern>" (matched from the name's start)
  int64_t bits = 0;                  // 4 or 8 (float: 8)
  bool is_float = false;             // type "float": FP8 E4M3
  bool symmetric = true;             // false: zero points (4-bit only)
  std::string strategy;              // tensor, channel, group, block
  int64_t group_size = 0;            // strategy group
  int64_t block_rows = 0, block_cols = 0;  // strategy block
  bool desc_act = false;  // GPTQ desc_act, compressed-tensors actorder group: a g_idx per column
};

// A GPTQ `dynamic` entry: modules whose name the pattern matches (Python's re.match, the first
// entry that matches deciding) are left unquantized ("-:") or quantized by their own scheme.
struct PrequantRule {
  std::string pattern;
  bool skip = false;
  size_t scheme = 0;  // index into PrequantConfig::groups
};

struct PrequantConfig {
  PrequantMethod method = PrequantMethod::kNone;
  std::vector<PrequantScheme> groups;
  // kFp8: modules_to_not_convert (a module is ignored when its name contains an entry, as
  // transformers matches them); compressed-tensors: `ignore` (exact names, or "re:<pattern>"
  // matched from the name's start, as Python's re.match).
  // kAwq: modules_to_not_convert (as kFp8's); kGptq: none (lm_head: false, `dynamic` "-:" rules).
  std::vector<std::string> ignore;
  // kGptq / kAwq: groups[0] is the checkpoint's scheme; kGptq's dynamic rules add the others.
  std::vector<PrequantRule> rules;
  bool gptq_v1 = false;  // kGptq checkpoint_format gptq: zero points stored minus one

  bool quantized() const { return method != PrequantMethod::kNone; }
  // "Qwen FP8 (e4m3, 128×128 blocks)", "compressed-tensors pack-quantized int4 (group 32, zero
  // points)", ...
  std::string describe() const;
};

// Parses config.json's "quantization_config" value given as JSON text ("" or "null": none).
// `source` names the file in errors, which name the field and its value.
Result<PrequantConfig> parse_prequant_config(const std::string& json_text,
                                             const std::string& source);

enum class PrequantLayout { kExact, kFast };

struct PrequantStore {
  WeightStore store;
  std::vector<std::string> notes;  // what the load did that its user should hear once
  uint64_t quantized_modules = 0;  // modules converted
};

// The store the loaders read (see the file comment). `source` moves into the result's keep-alive.
// Errors name the tensor and what is wrong with it (a missing scale, a shape that disagrees, a
// NaN, an ignored module that holds quantized tensors, a module no config group targets).
Result<PrequantStore> open_prequant_store(WeightStore source, const PrequantConfig& cfg,
                                          PrequantLayout layout, ThreadPool* pool);

// The f32 value of each FP8 E4M3 byte (NaN for 0x7F and 0xFF).
float e4m3_to_f32(uint8_t b);

}  // namespace vlm
