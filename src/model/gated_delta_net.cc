// Qwen3.5's Gated DeltaNet layers in the text decoder (transformers' Qwen3_5GatedDeltaNet): their
// weights as the backend keeps them, and the layer's token mixing in a forward pass. The pass,
// the attention layers, the MLPs and the head are text_decoder.cc's, shared with Qwen3-VL.
#include <string>

#include "model/text_decoder.h"

namespace vlm {

ops::DeltaNetShape delta_net_shape(const Qwen3VLTextConfig& c) {
  ops::DeltaNetShape s;
  s.nk = c.linear_num_key_heads;
  s.nv = c.linear_num_value_heads;
  s.dk = c.linear_key_head_dim;
  s.dv = c.linear_value_head_dim;
  s.kernel = c.linear_conv_kernel_dim;
  s.tiled = c.linear_value_heads_tiled;
  return s;
}

ops::DeltaNetShape TextDecoder::delta_shape() const { return delta_net_shape(cfg_); }

// in_proj_qkv | in_proj_z | in_proj_b | in_proj_a as one product (a row of its output is
// DeltaNetShape::proj_dim), out_proj, and the small weights: the conv1d's taps turned tap-major
// ([kernel, conv_dim], so the kernel reads contiguous channels), A_log, dt_bias, the gated norm.
Status TextDecoder::init_delta_net(const TextLayerWeights& s, Layer* d) {
  const DeltaNetWeights& w = s.delta;
  const ops::DeltaNetShape shape = delta_shape();
  const int64_t C = shape.conv_dim(), K = shape.kernel;
  if (static_cast<int64_t>(w.conv1d.size()) != C * K ||
      static_cast<int64_t>(w.a_log.size()) != shape.nv ||
      static_cast<int64_t>(w.dt_bias.size()) != shape.nv ||
      static_cast<int64_t>(w.norm.size()) != shape.dv) {
    return internal_error("the Gated DeltaNet weights do not match the config");
  }
  ops::LinearOptions o;
  o.decoder_layer = true;
  const TensorView* in[] = {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a};
  VLM_ASSIGN_OR_RETURN(d->in_proj, be_.linear(in, o).with_context("in_proj_qkv/z/b/a"));
  const TensorView* out[] = {&w.out_proj};
  VLM_ASSIGN_OR_RETURN(d->out_proj, be_.linear(out, o).with_context("out_proj"));
  std::vector<float>& taps = conv_taps_.emplace_back(static_cast<size_t>(C * K));
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < K; ++j) taps[j * C + c] = w.conv1d[c * K + j];
  }
  d->delta.shape = shape;
  VLM_ASSIGN_OR_RETURN(d->delta.conv_w, be_.vector(taps));
  VLM_ASSIGN_OR_RETURN(d->delta.a_log, be_.vector(w.a_log));
  VLM_ASSIGN_OR_RETURN(d->delta.dt_bias, be_.vector(w.dt_bias));
  VLM_ASSIGN_OR_RETURN(d->gated_norm, be_.vector(w.norm));
  return ok_status();
}

// xn_ → in_proj → the conv, gates and delta rule over each sequence's state → the gated norm
// (its gate z from the same product) → out_proj into tmp_.
Status TextDecoder::run_delta_net(const Layer& L, const Pass& p, const KvCache& cache) const {
  const ops::DeltaNetShape& s = L.delta.shape;
  const int64_t T = p.rows;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  ops::Backend& be = be_;
  VLM_RETURN_IF_ERROR(be.linear(xn_.buf(), T, *L.in_proj, proj_.buf()));
  VLM_RETURN_IF_ERROR(be.gated_delta_net(proj_.buf(), p.attn, L.delta, cache.states(L.cache_index),
                                         mixed_.buf(), delta_out_.buf()));
  VLM_RETURN_IF_ERROR(be.gated_rms_norm(delta_out_.buf(), proj_.at(s.conv_dim()), s.proj_dim(), T,
                                        s.nv, s.dv, L.gated_norm, eps, delta_out_.buf()));
  return be.linear(delta_out_.buf(), T, *L.out_proj, tmp_.buf());
}

}  // namespace vlm
