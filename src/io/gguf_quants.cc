#include "io/gguf_quants.h"

#include <cstring>
#include <string>

#include "core/half.h"

// Every value below is one f32 product (or a product and a sum) of f32 operands, as ggml's
// reference code and the gguf package compute it; this file is compiled with -ffp-contract=off so
// that no product and sum is fused into one rounding (see src/CMakeLists.txt).

namespace vlm {
namespace {

constexpr int kQK = 256;  // a K-quant super-block's elements

// IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl).
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// A block of 32 nibbles as Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and each IQ4_XS sub-block store them:
// 16 bytes whose low nibbles are elements 0-15 and high ones 16-31; with `qh` (Q5_0, Q5_1), a
// little-endian u32 whose bit j is element j's fifth bit.
void unpack32(const uint8_t* qs, const uint8_t* qh, int* v) {
  uint32_t h = 0;
  if (qh != nullptr) std::memcpy(&h, qh, 4);
  for (int j = 0; j < 16; ++j) {
    v[j] = (qs[j] & 0x0F) | static_cast<int>(((h >> j) & 1u) << 4);
    v[j + 16] = (qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1u) << 4);
  }
}

// Q4_0: f16 d, the nibbles; d * (q - 8).
void block_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  int v[32];
  unpack32(b + 2, nullptr, v);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(v[j] - 8);
}

// Q4_1: f16 d, f16 m, the nibbles; d * q + m.
void block_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const float m = half_at(b + 2);
  int v[32];
  unpack32(b + 4, nullptr, v);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(v[j]) + m;
}

// Q5_0: f16 d, the fifth bits, the nibbles; d * (q - 16).
void block_q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  int v[32];
  unpack32(b + 6, b + 2, v);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(v[j] - 16);
}

// Q5_1: f16 d, f16 m, the fifth bits, the nibbles; d * q + m.
void block_q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const float m = half_at(b + 2);
  int v[32];
  unpack32(b + 8, b + 4, v);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(v[j]) + m;
}

// Q8_0: f16 d, 32 signed bytes.
void block_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: 16 bytes of 4-bit scale | 4-bit min per 16 elements, 64 bytes of 2-bit values, f16 d,
// f16 dmin. Element e's value: bits 2s..2s+1 of qs[32 * (e / 128) + e % 32], s = (e / 32) % 4.
void block_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half_at(b + 80);
  const float dmin = half_at(b + 82);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(scales[g] & 0xF);
    const float ml = dmin * static_cast<float>(scales[g] >> 4);
    for (int k = 0; k < 16; ++k) {
      const int e = g * 16 + k;
      const int q = (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
      y[e] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, f16 d.
// Scale g: its low 4 bits from byte g % 8 (nibble g / 8), its high 2 from byte 8 + g % 4 (pair
// g / 4), minus 32. Element e: 2 bits as Q2_K's, less 4 when bit e / 32 of hmask[e % 32] is 0.
void block_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = half_at(b + 108);
  for (int g = 0; g < 16; ++g) {
    const int lo = (sc[g % 8] >> (4 * (g / 8))) & 0x0F;
    const int hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 0x03;
    const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
    for (int k = 0; k < 16; ++k) {
      const int e = g * 16 + k;
      const int ql = (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
      const int h = (hmask[e % 32] >> (e / 32)) & 1;
      y[e] = dl * static_cast<float>(ql - ((h ^ 1) << 2));
    }
  }
}

// The 6-bit scale and min of Q4_K's and Q5_K's sub-block j (0-7) from their 12 bytes.
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes of nibbles. Sub-block j (32
// elements) reads the low nibbles of bytes 32 * (j / 2).. when j is even, the high when odd;
// (d * sc) * q - (dmin * m). Q5_K (`five`): the same fields, then 32 bytes of fifth bits (bit j
// of qh[l] is element 32 * j + l's) before the nibbles.
void block_k45(const uint8_t* b, float* y, bool five) {
  const float d = half_at(b);
  const float dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int sc = 0;
    int m = 0;
    scale_min_k4(j, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | (five ? ((qh[l] >> j) & 1) << 4 : 0);
      y[32 * j + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

void block_q4_k(const uint8_t* b, float* y) { block_k45(b, y, false); }
void block_q5_k(const uint8_t* b, float* y) { block_k45(b, y, true); }

// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed scales, f16 d. In half
// h (128 elements), element 32 * s + l (s 0-3): the low nibble (s < 2) or high (s >= 2) of
// ql[64 h + 32 (s % 2) + l], the bits 2s..2s+1 of qh[32 h + l]; (d * scale[e / 16]) * (q - 32).
void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128;
    const int s = (e % 128) / 32;
    const int l = e % 32;
    const int lo = (ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
    const int hi = (qh[32 * h + l] >> (2 * s)) & 0x03;
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

// IQ4_NL: f16 d, the nibbles indexing the 16 levels.
void block_iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  int v[32];
  unpack32(b + 2, nullptr, v);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(kIq4nlValues[v[j]]);
}

// IQ4_XS: f16 d, u16 high scale bits (2 per sub-block), 4 bytes of low scale nibbles, then per
// sub-block of 32 its 16 bytes of nibbles, laid out as Q4_0's.
void block_iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 8; ++j) {
    const int lo = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0F;
    const int hi = (scales_h >> (2 * j)) & 0x03;
    const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
    int v[32];
    unpack32(qs + 16 * j, nullptr, v);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * static_cast<float>(kIq4nlValues[v[l]]);
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
      return block_q4_0;
    case GgmlType::kQ4_1:
      return block_q4_1;
    case GgmlType::kQ5_0:
      return block_q5_0;
    case GgmlType::kQ5_1:
      return block_q5_1;
    case GgmlType::kQ8_0:
      return block_q8_0;
    case GgmlType::kQ2_K:
      return block_q2_k;
    case GgmlType::kQ3_K:
      return block_q3_k;
    case GgmlType::kQ4_K:
      return block_q4_k;
    case GgmlType::kQ5_K:
      return block_q5_k;
    case GgmlType::kQ6_K:
      return block_q6_k;
    case GgmlType::kIQ4_NL:
      return block_iq4_nl;
    case GgmlType::kIQ4_XS:
      return block_iq4_xs;
    default:
      return nullptr;
  }
}

}  // namespace

bool ggml_can_dequantize(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16 ||
         block_fn(t) != nullptr;
}

Status dequantize(GgmlType t, std::span<const uint8_t> src, std::span<float> out) {
  if (!ggml_can_dequantize(t)) {
    return invalid_argument(std::string("tensor type ") + ggml_type_name(t) +
                            " is not one this engine reads (F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                            "Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)");
  }
  const GgmlBlock blk = ggml_block(t);
  const auto n = static_cast<int64_t>(out.size());
  if (n % blk.block != 0 || static_cast<int64_t>(src.size()) != n / blk.block * blk.bytes) {
    return invalid_argument(std::string(ggml_type_name(t)) + ": " + std::to_string(n) +
                            " elements need whole blocks of " + std::to_string(blk.block) + " in " +
                            std::to_string(n / blk.block * blk.bytes) + " bytes, got " +
                            std::to_string(src.size()));
  }
  const uint8_t* p = src.data();
  float* y = out.data();
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(y, p, src.size());
      return ok_status();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) y[i] = half_at(p + 2 * i);
      return ok_status();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        y[i] = bf16_to_f32(h);
      }
      return ok_status();
    default:
      break;
  }
  const BlockFn fn = block_fn(t);
  for (int64_t k = 0; k < n / blk.block; ++k) fn(p + k * blk.bytes, y + k * blk.block);
  return ok_status();
}

Status dequantize(const GgufTensor& t, std::span<float> out) {
  if (static_cast<int64_t>(out.size()) != t.numel()) {
    return invalid_argument("tensor '" + t.name + "': " + std::to_string(t.numel()) +
                            " elements, the output holds " + std::to_string(out.size()));
  }
  Status s = dequantize(t.type, {t.data, t.nbytes}, out);
  if (!s.ok()) return Status(s.code(), "tensor '" + t.name + "': " + s.message());
  return ok_status();
}

}  // namespace vlm
