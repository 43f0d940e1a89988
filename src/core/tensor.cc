#include "core/tensor.h"

namespace vlm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF64:
      return 8;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kI16:
      return 2;
    case DType::kI8:
      return 1;
    case DType::kI4:
      return 1;  // two elements
    case DType::kU8:
      return 1;
    case DType::kBool:
      return 1;
    case DType::kF8E4M3:
      return 1;
    case DType::kQ8_0:
      return 34;
    case DType::kQ4K:
      return 144;
    case DType::kQ5K:
      return 176;
    case DType::kQ6K:
      return 210;
  }
  return 0;
}

int64_t dtype_block(DType t) {
  if (t == DType::kI4) return 2;
  if (t == DType::kQ8_0) return 32;
  return is_ggml_block(t) ? 256 : 1;
}

size_t dtype_nbytes(DType t, int64_t numel) {
  const int64_t block = dtype_block(t);
  return static_cast<size_t>((numel + block - 1) / block) * dtype_size(t);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kI4:
      return "I4";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4K:
      return "Q4_K";
    case DType::kQ5K:
      return "Q5_K";
    case DType::kQ6K:
      return "Q6_K";
  }
  return "?";
}

bool dtype_from_name(std::string_view n, DType* out) {
  static const struct {
    const char* name;
    DType t;
  } kTable[] = {
      {"F32", DType::kF32},   {"BF16", DType::kBF16},      {"F16", DType::kF16},
      {"F64", DType::kF64},   {"I64", DType::kI64},        {"I32", DType::kI32},
      {"I16", DType::kI16},   {"I8", DType::kI8},          {"U8", DType::kU8},
      {"BOOL", DType::kBool}, {"F8_E4M3", DType::kF8E4M3},
  };
  for (const auto& e : kTable) {
    if (n == e.name) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

size_t TensorView::quant_nbytes() const {
  if (dtype == DType::kI8 && scale != nullptr) return static_cast<size_t>(shape[0]) * 4;
  if (dtype == DType::kI4 && int4.scale != nullptr) {
    const auto groups = static_cast<size_t>(numel() / int4.group);
    return groups * (int4.zero != nullptr ? 3 : 2);
  }
  return 0;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace vlm
