#include "ops/backend.h"

namespace vlm::ops {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Status Backend::memory_info(int64_t*, int64_t*) const {
  return unimplemented(std::string("memory_info on ") + device_name(device()));
}
bool Backend::device_stats(DeviceStats*) const { return false; }
Status Backend::patchify(Buf, Buf, int64_t, int64_t, int64_t, int64_t, int64_t, Buf) {
  return internal_error(std::string("an image without pixel values reached the vision tower on ") +
                        device_name(device()));
}
Status Backend::argmax_rows(Buf, int64_t, int64_t, Buf) {
  return internal_error(std::string("no sampling on the device on ") + device_name(device()));
}
Status Backend::sample_rows(Buf, int64_t, Buf, int64_t, Buf, Buf) {
  return internal_error(std::string("no sampling on the device on ") + device_name(device()));
}
namespace {
Status no_hybrid(Device d) {
  return unimplemented(std::string("no Qwen3.5 (Gated DeltaNet) kernels on ") + device_name(d));
}
}  // namespace
Status Backend::qkv_gated_rope_store(Buf, int64_t, int64_t, int64_t, int64_t, int64_t, Buf, Buf,
                                     float, Buf, Buf, Buf, Buf, Buf, const KvLayer&) {
  return no_hybrid(device());
}
Status Backend::sigmoid_mul(Buf, Buf, int64_t, int64_t) { return no_hybrid(device()); }
Status Backend::add_sigmoid_scaled(Buf, Buf, Buf, int64_t, int64_t) { return no_hybrid(device()); }
Status Backend::copy(Buf, Buf, size_t) { return no_hybrid(device()); }
Status Backend::gated_delta_net(Buf, const AttentionBatch&, const DeltaNetLayer&, Buf, Buf, Buf) {
  return no_hybrid(device());
}
Status Backend::gated_rms_norm(Buf, Buf, int64_t, int64_t, int64_t, int64_t, Buf, float, Buf) {
  return no_hybrid(device());
}
Status Backend::moe_route(Buf, int64_t, int64_t, int64_t, bool, Buf, Buf) {
  return unimplemented(std::string("no mixture-of-experts kernels on ") + device_name(device()));
}
Status Backend::moe_experts(Buf, int64_t, Buf, Buf, int64_t, std::span<const Linear* const>,
                            std::span<const Linear* const>, Buf, Buf) {
  return unimplemented(std::string("no mixture-of-experts kernels on ") + device_name(device()));
}
int64_t Backend::moe_scratch_elems(int64_t rows, int64_t, int64_t, int64_t n, int64_t I) const {
  return rows * (2 * n + 3 * I);
}
Status Backend::begin_capture() {
  return internal_error(std::string("no graphs on ") + device_name(device()));
}
Status Backend::end_capture(std::unique_ptr<Graph>*) {
  return internal_error(std::string("no graphs on ") + device_name(device()));
}

}  // namespace vlm::ops
