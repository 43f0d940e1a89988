#include "kernels/cuda/weights.h"

#include <cstring>
#include <string>

#include "core/half.h"

namespace vlm::cuda {

Status device_bytes(const TensorView& w, DType target, std::vector<uint8_t>* out) {
  const int64_t n = w.numel();
  float (*read)(const void*, int64_t) = nullptr;
  switch (w.dtype) {
    case vlm::DType::kF32:
      read = [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; };
      break;
    case vlm::DType::kBF16:
      read = [](const void* p, int64_t i) {
        return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
      };
      break;
    case vlm::DType::kF16:
      read = [](const void* p, int64_t i) {
        return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
      };
      break;
    default:
      return unimplemented(std::string("CUDA backend: weights stored as ") + dtype_name(w.dtype) +
                           " are not supported (F32, BF16, F16 are)");
  }
  if (target == DType::kF32) {
    out->resize(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float v = read(w.data, i);
      std::memcpy(out->data() + 4 * i, &v, 4);
    }
  } else if (w.dtype == vlm::DType::kBF16) {
    out->resize(static_cast<size_t>(n) * 2);
    std::memcpy(out->data(), w.data, out->size());
  } else {
    out->resize(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_bf16(read(w.data, i));
      std::memcpy(out->data() + 2 * i, &h, 2);
    }
  }
  return ok_status();
}

Status upload_tensor(const TensorView& w, DType target, DeviceBuffer* out) {
  std::vector<uint8_t> bytes;
  if (Status s = device_bytes(w, target, &bytes); !s.ok()) return s;
  if (Status s = DeviceBuffer::allocate(bytes.size(), out); !s.ok()) return s;
  return out->upload(bytes.data(), bytes.size());
}

Status upload_stacked(const std::vector<const TensorView*>& ws, DType target, DeviceBuffer* out) {
  std::vector<uint8_t> all, one;
  for (const TensorView* w : ws) {
    if (w->rank() != 2 || w->dim(1) != ws.front()->dim(1)) {
      return invalid_argument("stacked weights must be [N, K] with one K");
    }
    if (Status s = device_bytes(*w, target, &one); !s.ok()) return s;
    all.insert(all.end(), one.begin(), one.end());
  }
  if (Status s = DeviceBuffer::allocate(all.size(), out); !s.ok()) return s;
  return out->upload(all.data(), all.size());
}

}  // namespace vlm::cuda
