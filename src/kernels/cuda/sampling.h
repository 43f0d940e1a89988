#pragma once
// Sampling on the GPU: repetition / presence / frequency penalties, temperature,
// top-k, top-p and min-p over a logit row, then one draw, in the host Sampler's order
// (src/engine/sampler.h). The draw walks the kept tokens in id order (the host walks them by
// falling logit), so the two pick from the same distribution but not the same token for a given
// u. One CTA per sampled row.
#include <cstdint>

#include "vlm/status.h"

namespace vlm::cuda {

// One penalised token of a row: logit = logit < 0 ? logit · repetition : logit / repetition,
// then logit −= subtract (presence + frequency · count).
struct PenaltyEntry {
  int32_t id;
  float repetition;
  float subtract;
};

// One row to draw from (plain data, copied to the device as is).
struct SampleParams {
  int32_t row = 0;    // the logit row
  int32_t top_k = 0;  // 0: off (ties with the k-th logit stay, as transformers keeps them)
  float inv_temperature = 1;
  float top_p = 1;                             // 1: off
  float min_p = 0;                             // 0: off
  float u = 0;                                 // the draw, uniform in [0, 1)
  int32_t penalty_begin = 0, penalty_end = 0;  // this row's entries in the penalty array
};

// ids[i] = the token drawn for params[i] from logits [*, vocab] (f32, penalised in place).
// params, penalties and ids are device arrays; penalty ids must be distinct within a row.
Status sample_rows(float* logits, int64_t vocab, const SampleParams* params, int64_t n,
                   const PenaltyEntry* penalties, int32_t* ids);

}  // namespace vlm::cuda
