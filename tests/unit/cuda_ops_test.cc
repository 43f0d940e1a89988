// The CUDA backend's small ops (src/kernels/cuda/cuda_ops.h) against the CPU reference
// (src/ops/ref), in F32 and BF16 activations. Without a CUDA device every test reports skipped,
// never passed.
#include "kernels/cuda/cuda_ops.h"

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/int8_gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/weights.h"
#include "ops/ref/ref.h"

namespace vlm::cuda {
namespace {

#define SKIP_WITHOUT_DEVICE() \
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device"

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Values as the device holds them: f32, or rounded to BF16 (and read back as f32 on the host).
struct Act {
  DType t;
  size_t bytes(size_t n) const { return n * (t == DType::kF32 ? 4 : 2); }
  std::vector<uint8_t> encode(const std::vector<float>& v) const {
    std::vector<uint8_t> out(bytes(v.size()));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == DType::kF32) {
        std::memcpy(out.data() + 4 * i, &v[i], 4);
      } else {
        const uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
    return out;
  }
  std::vector<float> decode(const std::vector<uint8_t>& b) const {
    std::vector<float> out(b.size() / (t == DType::kF32 ? 4 : 2));
    for (size_t i = 0; i < out.size(); ++i) {
      if (t == DType::kF32) {
        std::memcpy(&out[i], b.data() + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, b.data() + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
    }
    return out;
  }
  std::vector<float> round(const std::vector<float>& v) const { return decode(encode(v)); }
  // |device - reference| allowed: the f32 arithmetic's relative bound `rel` (sums in another
  // order, rsqrtf and expf within 2 ulp), plus, in BF16, one BF16 ulp (2^-7 relative) where the
  // two f32 results round to neighbouring BF16 values.
  float tol(float ref, float rel) const {
    return ((t == DType::kF32 ? 0.f : 1.f / 128) + rel) * std::fabs(ref) + 1e-6f;
  }
};

// Rotary tables of random angles: cos and sin [count].
struct Rotary {
  std::vector<float> cos, sin;
};
Rotary random_rotary(size_t count, uint32_t seed) {
  Rotary r{std::vector<float>(count), std::vector<float>(count)};
  const auto angle = random_values(count, seed, 3.f);
  for (size_t i = 0; i < count; ++i) {
    r.cos[i] = std::cos(angle[i]);
    r.sin[i] = std::sin(angle[i]);
  }
  return r;
}

DeviceBuffer upload(const std::vector<uint8_t>& host) {
  DeviceBuffer b;
  EXPECT_TRUE(DeviceBuffer::allocate(host.size(), &b).ok());
  EXPECT_TRUE(b.upload(host.data(), host.size()).ok());
  return b;
}

DeviceBuffer upload_f32(const std::vector<float>& host) {
  std::vector<uint8_t> bytes(host.size() * 4);
  std::memcpy(bytes.data(), host.data(), bytes.size());
  return upload(bytes);
}

std::vector<uint8_t> download(const DeviceBuffer& b) {
  std::vector<uint8_t> host(b.bytes());
  EXPECT_TRUE(b.download(host.data(), host.size()).ok());
  return host;
}

constexpr float kU = 1.f / (1 << 24);  // f32 unit roundoff

// A sum of n squares in f32 is within n·u of exact whatever the order, so two orders differ by
// at most 2n·u; rsqrt halves that, and the scaling adds a few roundings.
float rms_rel(int64_t n) { return (static_cast<float>(n) + 8) * kU; }

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const Act& a,
                  float rel, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (!(std::fabs(got[i] - want[i]) <= a.tol(want[i], rel))) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << want[i];
      ++bad;
    }
  }
}

class CudaOps : public ::testing::TestWithParam<DType> {};

// cuBLAS is opened at run time, not linked: its libraries are found and export every function the
// products call (no GPU needed for this).
TEST(CudaDevice, CublasOpensWithEveryFunction) {
  const Status s = Gemm::open_cublas();
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(CudaDevice, CountAndDescription) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_GT(device_count(), 0);
  EXPECT_NE(device_description(0).find("sm_"), std::string::npos) << device_description(0);
}

TEST_P(CudaOps, RmsNormMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  for (int64_t n : {1, 17, 256, 2048, 4100}) {
    for (int64_t rows : {1, 3, 7}) {
      const auto x = a.round(random_values(rows * n, 1, 3.f));
      const auto w = random_values(n, 2);
      std::vector<float> want(x.size());
      ops::ref::rms_norm(x.data(), w.data(), rows, n, 1e-6f, want.data());
      DeviceBuffer dx = upload(a.encode(x)), dw = upload_f32(w), dy;
      ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(x.size()), &dy).ok());
      ASSERT_TRUE(
          rms_norm(dx.data(), static_cast<const float*>(dw.data()), rows, n, 1e-6f, dy.data(), a.t)
              .ok());
      ASSERT_TRUE(synchronize().ok());
      expect_close(a.decode(download(dy)), a.round(want), a, rms_rel(n), "rms_norm");
    }
  }
}

TEST_P(CudaOps, AddRmsNormMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t rows = 5, n = 1000;
  auto x = a.round(random_values(rows * n, 3));
  const auto delta = a.round(random_values(rows * n, 4));
  const auto w = random_values(n, 5);
  DeviceBuffer dx = upload(a.encode(x)), dd = upload(a.encode(delta)), dw = upload_f32(w), dy;
  ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(x.size()), &dy).ok());
  ASSERT_TRUE(add_rms_norm(dx.data(), dd.data(), static_cast<const float*>(dw.data()), rows, n,
                           1e-6f, dy.data(), a.t)
                  .ok());
  ASSERT_TRUE(synchronize().ok());
  // The reference on what the device stores: the residual rounded to the activation type.
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + delta[i];
  sum = a.round(sum);
  std::vector<float> want(x.size());
  ops::ref::rms_norm(sum.data(), w.data(), rows, n, 1e-6f, want.data());
  expect_close(a.decode(download(dx)), sum, a, 0.f, "residual");
  expect_close(a.decode(download(dy)), a.round(want), a, rms_rel(n), "norm");
}

TEST_P(CudaOps, QkNormRopeMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  for (int64_t head_dim : {64, 128}) {
    for (int64_t heads : {2, 16}) {
      const int64_t tokens = 5, half = head_dim / 2;
      const auto x = a.round(random_values(tokens * heads * head_dim, 9, 2.f));
      const auto w = random_values(head_dim, 10);
      const auto [cos, sin] = random_rotary(tokens * half, 11);
      std::vector<float> want = x;
      ops::ref::qk_norm_rope(want.data(), tokens, heads, head_dim, w.data(), 1e-6f, cos.data(),
                             sin.data());
      DeviceBuffer dx = upload(a.encode(x)), dw = upload_f32(w), dc = upload_f32(cos),
                   ds = upload_f32(sin);
      ASSERT_TRUE(qk_norm_rope(dx.data(), tokens, heads, head_dim,
                               static_cast<const float*>(dw.data()), 1e-6f,
                               static_cast<const float*>(dc.data()),
                               static_cast<const float*>(ds.data()), a.t)
                      .ok());
      ASSERT_TRUE(synchronize().ok());
      // The rotation sums two products of values up to max|x·w|: bound it by the row's scale.
      std::vector<float> got = a.decode(download(dx));
      const auto ref = a.round(want);
      for (size_t i = 0; i < got.size(); ++i) {
        const float scale = std::fabs(ref[i]) + 4.f;
        ASSERT_LE(std::fabs(got[i] - ref[i]), a.tol(scale, rms_rel(head_dim) + 8 * kU))
            << "head_dim " << head_dim << " heads " << heads << " [" << i << "]";
      }
    }
  }
}

// The vision tower's ops: LayerNorm, its fused residual add (with the linear layer's bias), the
// bias + GELU of both forms, the bias add, and the rotary without a norm. LayerNorm's bound:
// mean and variance in f32 over n values, (2n + 16)·u relative to the row's scale.
TEST_P(CudaOps, VisionOpsMatchReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t rows = 6, n = 1152;
  const float rel = (2.f * n + 16) * kU;
  const auto x = a.round(random_values(rows * n, 40, 2.f));
  const auto delta = a.round(random_values(rows * n, 41));
  const auto w = random_values(n, 42), b = random_values(n, 43), bias = random_values(n, 44);
  auto close_scaled = [&](const std::vector<float>& got, const std::vector<float>& want,
                          float scale_floor, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float tol = a.tol(std::fabs(want[i]) + scale_floor, rel);
      ASSERT_LE(std::fabs(got[i] - want[i]), tol) << what << "[" << i << "]";
    }
  };
  {  // layer_norm
    std::vector<float> want(x.size());
    ops::ref::layer_norm(x.data(), w.data(), b.data(), rows, n, 1e-6f, want.data());
    DeviceBuffer dx = upload(a.encode(x)), dw = upload_f32(w), db = upload_f32(b), dy;
    ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(x.size()), &dy).ok());
    ASSERT_TRUE(layer_norm(dx.data(), static_cast<const float*>(dw.data()),
                           static_cast<const float*>(db.data()), rows, n, 1e-6f, dy.data(), a.t)
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    close_scaled(a.decode(download(dy)), a.round(want), 4.f, "layer_norm");
  }
  {  // add_layer_norm: the residual as stored, then its norm
    std::vector<float> sum(x.size());
    for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + (delta[i] + bias[i % n]);
    sum = a.round(sum);
    std::vector<float> want(x.size());
    ops::ref::layer_norm(sum.data(), w.data(), b.data(), rows, n, 1e-6f, want.data());
    DeviceBuffer dx = upload(a.encode(x)), dd = upload(a.encode(delta)), dw = upload_f32(w),
                 db = upload_f32(b), dbias = upload_f32(bias), dy;
    ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(x.size()), &dy).ok());
    ASSERT_TRUE(add_layer_norm(dx.data(), dd.data(), static_cast<const float*>(dbias.data()),
                               static_cast<const float*>(dw.data()),
                               static_cast<const float*>(db.data()), rows, n, 1e-6f, dy.data(), a.t)
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    expect_close(a.decode(download(dx)), sum, a, 2 * kU, "add_layer_norm residual");
    close_scaled(a.decode(download(dy)), a.round(want), 4.f, "add_layer_norm");
  }
  for (bool tanh : {true, false}) {  // bias_gelu
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] + bias[i % n];
    if (tanh) {
      ops::ref::gelu_tanh(want.data(), static_cast<int64_t>(want.size()));
    } else {
      ops::ref::gelu_erf(want.data(), static_cast<int64_t>(want.size()));
    }
    DeviceBuffer dx = upload(a.encode(x)), dbias = upload_f32(bias);
    ASSERT_TRUE(
        bias_gelu(dx.data(), static_cast<const float*>(dbias.data()), rows, n, tanh, a.t).ok());
    ASSERT_TRUE(synchronize().ok());
    close_scaled(a.decode(download(dx)), a.round(want), 1.f, tanh ? "gelu_tanh" : "gelu_erf");
  }
  {  // add_bias
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] + bias[i % n];
    DeviceBuffer dx = upload(a.encode(x)), dbias = upload_f32(bias);
    ASSERT_TRUE(add_bias(dx.data(), static_cast<const float*>(dbias.data()), rows, n, a.t).ok());
    ASSERT_TRUE(synchronize().ok());
    expect_close(a.decode(download(dx)), a.round(want), a, kU, "add_bias");
  }
  {  // rotary alone (w null), head_dim 72 as the vision tower's 1152 / 16
    const int64_t tokens = 5, heads = 16, hd = 72, half = hd / 2;
    const auto q = a.round(random_values(tokens * heads * hd, 45, 2.f));
    const auto [cos, sin] = random_rotary(tokens * half, 46);
    std::vector<float> want = q;
    ops::ref::rope_neox(want.data(), tokens, heads, hd, cos.data(), sin.data());
    DeviceBuffer dq = upload(a.encode(q)), dc = upload_f32(cos), ds = upload_f32(sin);
    ASSERT_TRUE(qk_norm_rope(dq.data(), tokens, heads, hd, nullptr, 0.f,
                             static_cast<const float*>(dc.data()),
                             static_cast<const float*>(ds.data()), a.t)
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    close_scaled(a.decode(download(dq)), a.round(want), 4.f, "rope");
  }
}

// The decoder layer's fused step after the q|k|v product: q heads normed and rotated into q, k
// heads normed and rotated into their cache slots, v heads copied to theirs; other slots
// untouched. Against the reference qk_norm_rope on each part.
TEST_P(CudaOps, QkvRopeStoreMatchesTheSeparateOps) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t tokens = 4, nh = 8, nkv = 2, hd = 128, half = hd / 2, kvd = nkv * hd;
  const int64_t width = (nh + 2 * nkv) * hd, pool_rows = 40;
  const auto qkv = a.round(random_values(tokens * width, 50, 2.f));
  const auto qw = random_values(hd, 51), kw = random_values(hd, 52);
  const auto [cos, sin] = random_rotary(tokens * half, 53);
  const std::vector<int32_t> slots = {7, 31, 0, 12};
  std::vector<float> q(tokens * nh * hd), k(tokens * kvd), v(tokens * kvd);
  for (int64_t i = 0; i < tokens; ++i) {
    std::copy_n(qkv.begin() + i * width, nh * hd, q.begin() + i * nh * hd);
    std::copy_n(qkv.begin() + i * width + nh * hd, kvd, k.begin() + i * kvd);
    std::copy_n(qkv.begin() + i * width + nh * hd + kvd, kvd, v.begin() + i * kvd);
  }
  ops::ref::qk_norm_rope(q.data(), tokens, nh, hd, qw.data(), 1e-6f, cos.data(), sin.data());
  ops::ref::qk_norm_rope(k.data(), tokens, nkv, hd, kw.data(), 1e-6f, cos.data(), sin.data());
  const auto pool0 = a.round(random_values(pool_rows * kvd, 54));
  std::vector<float> kwant = pool0, vwant = pool0;
  for (int64_t i = 0; i < tokens; ++i) {
    std::copy_n(k.begin() + i * kvd, kvd, kwant.begin() + slots[i] * kvd);
    std::copy_n(v.begin() + i * kvd, kvd, vwant.begin() + slots[i] * kvd);
  }
  std::vector<uint8_t> slot_bytes(slots.size() * 4);
  std::memcpy(slot_bytes.data(), slots.data(), slot_bytes.size());
  DeviceBuffer dqkv = upload(a.encode(qkv)), dqw = upload_f32(qw), dkw = upload_f32(kw),
               dc = upload_f32(cos), ds = upload_f32(sin), dslots = upload(slot_bytes),
               dkc = upload(a.encode(pool0)), dvc = upload(a.encode(pool0)), dq;
  ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(q.size()), &dq).ok());
  ASSERT_TRUE(
      qkv_rope_store(dqkv.data(), tokens, nh, nkv, hd, static_cast<const float*>(dqw.data()),
                     static_cast<const float*>(dkw.data()), 1e-6f,
                     static_cast<const float*>(dc.data()), static_cast<const float*>(ds.data()),
                     static_cast<const int32_t*>(dslots.data()), dq.data(), dkc.data(), dvc.data(),
                     a.t)
          .ok());
  ASSERT_TRUE(synchronize().ok());
  auto check = [&](const std::vector<float>& got, const std::vector<float>& want,
                   const char* what) {
    const auto ref = a.round(want);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_LE(std::fabs(got[i] - ref[i]), a.tol(std::fabs(ref[i]) + 4.f, rms_rel(hd) + 8 * kU))
          << what << "[" << i << "]";
    }
  };
  check(a.decode(download(dq)), q, "q");
  check(a.decode(download(dkc)), kwant, "k cache");
  EXPECT_EQ(a.decode(download(dvc)), a.round(vwant));  // v: copied as is
}

TEST_P(CudaOps, SiluMulRowsMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t rows = 7, n = 3001;
  const auto gu = a.round(random_values(rows * 2 * n, 55, 4.f));
  std::vector<float> g(rows * n), u(rows * n), want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(gu.begin() + r * 2 * n, n, g.begin() + r * n);
    std::copy_n(gu.begin() + r * 2 * n + n, n, u.begin() + r * n);
  }
  ops::ref::silu_mul(g.data(), u.data(), rows * n, want.data());
  DeviceBuffer dgu = upload(a.encode(gu)), dy;
  ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(want.size()), &dy).ok());
  ASSERT_TRUE(silu_mul_rows(dgu.data(), rows, n, dy.data(), a.t).ok());
  ASSERT_TRUE(synchronize().ok());
  expect_close(a.decode(download(dy)), a.round(want), a, 8 * kU, "silu_mul_rows");
}

TEST_P(CudaOps, AddRowsAtAddsTheDeepStackFeatures) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t seq = 12, n = 520;
  const std::vector<int32_t> rows = {2, 3, 4, 9};
  std::vector<uint8_t> row_bytes(rows.size() * 4);
  std::memcpy(row_bytes.data(), rows.data(), row_bytes.size());
  DeviceBuffer dr = upload(row_bytes);
  for (const Act d : {a, Act{DType::kF32}}) {  // features in the activation type, or f32
    auto x = a.round(random_values(seq * n, 12));
    const auto delta = d.round(random_values(rows.size() * n, 13));
    DeviceBuffer dx = upload(a.encode(x)), dd = upload(d.encode(delta));
    ASSERT_TRUE(add_rows_at(dx.data(), static_cast<const int32_t*>(dr.data()), dd.data(), d.t,
                            static_cast<int64_t>(rows.size()), n, a.t)
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t j = 0; j < n; ++j) x[rows[i] * n + j] += delta[i * n + j];
    }
    expect_close(a.decode(download(dx)), a.round(x), a, 0.f, "add_rows_at");  // others untouched
  }
}

// The merger's f32 features replace the image pads' rows; the other rows stay as they were.
TEST_P(CudaOps, SetRowsAtReplacesTheImageRows) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t seq = 10, n = 300;
  const std::vector<int32_t> rows = {1, 5, 6};
  std::vector<uint8_t> row_bytes(rows.size() * 4);
  std::memcpy(row_bytes.data(), rows.data(), row_bytes.size());
  auto x = a.round(random_values(seq * n, 30));
  const auto src = random_values(rows.size() * n, 31);
  DeviceBuffer dx = upload(a.encode(x)), dr = upload(row_bytes), ds = upload_f32(src);
  ASSERT_TRUE(set_rows_at(dx.data(), static_cast<const int32_t*>(dr.data()), ds.data(), DType::kF32,
                          static_cast<int64_t>(rows.size()), n, a.t)
                  .ok());
  ASSERT_TRUE(synchronize().ok());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(src.begin() + i * n, n, x.begin() + rows[i] * n);
  }
  EXPECT_EQ(a.decode(download(dx)), a.round(x));
}

TEST_P(CudaOps, AddInplaceAddsElementwise) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t count = 70001;
  auto x = a.round(random_values(count, 32));
  const auto d = a.round(random_values(count, 33));
  DeviceBuffer dx = upload(a.encode(x)), dd = upload(a.encode(d));
  ASSERT_TRUE(add_inplace(dx.data(), dd.data(), a.t, count, a.t).ok());
  ASSERT_TRUE(synchronize().ok());
  for (int64_t i = 0; i < count; ++i) x[i] += d[i];
  expect_close(a.decode(download(dx)), a.round(x), a, 0.f, "add_inplace");
}

DeviceBuffer upload_ints(const std::vector<int32_t>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return upload(b);
}

// Attention output against the double-precision reference: the output is a convex combination
// of v, and the f32 online softmax is within a few roundings per key of exact, so (keys + 16)·4u·
// max|v|, plus `extra` (BF16 probabilities in flash attention) and, in BF16, one BF16 ulp.
void expect_attention_close(const Act& a, const std::vector<float>& got,
                            const std::vector<float>& want, int64_t keys, float vmax, float extra,
                            const std::string& what) {
  const auto ref = a.round(want);
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const float bound = static_cast<float>(keys + 16) * 4 * kU * vmax + extra +
                        (a.t == DType::kBF16 ? std::fabs(ref[i]) / 128 : 0.f) + 1e-6f;
    ASSERT_LE(std::fabs(got[i] - ref[i]), bound) << what << " [" << i << "]";
  }
}

float max_abs(const std::vector<float>& v) {
  float m = 0.f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// A varlen batch over the paged cache, as the decoder runs it: each sequence's `first` cached
// tokens and this step's `n`, its blocks scattered through the pool, every K/V row already in its
// slot; with the double-precision reference output of each sequence on its contiguous K/V.
struct PagedBatch {
  struct Seq {
    int64_t first, n;
  };
  int64_t heads, kv_heads, hd, bs = 16;
  int64_t max_blocks = 0, tokens = 0, max_seen = 0;
  float vmax = 0.f;
  std::vector<int64_t> chunk_off, chunk_n;
  std::vector<float> want;
  DeviceBuffer q, k_cache, v_cache, tok_seq, tok_pos, tables;

  PagedBatch(const Act& a, int64_t heads_, int64_t kv_heads_, int64_t hd_,
             const std::vector<Seq>& seqs)
      : heads(heads_), kv_heads(kv_heads_), hd(hd_) {
    const int64_t kvd = kv_heads * hd;
    for (const Seq& s : seqs) {
      max_blocks = std::max(max_blocks, (s.first + s.n + bs - 1) / bs);
      chunk_off.push_back(tokens);
      chunk_n.push_back(s.n);
      tokens += s.n;
      max_seen = std::max(max_seen, s.first + s.n);
    }
    const int64_t pool_blocks = max_blocks * static_cast<int64_t>(seqs.size()) + 5;
    std::vector<int32_t> perm(pool_blocks);
    for (int64_t b = 0; b < pool_blocks; ++b) perm[b] = static_cast<int32_t>(b);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(34));
    std::vector<int32_t> table(seqs.size() * max_blocks, -1), seq_of, pos_of;
    std::vector<float> kpool(pool_blocks * bs * kvd, 0.f), vpool(kpool.size(), 0.f), q_all;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t n_kv = seqs[s].first + seqs[s].n, n = seqs[s].n;
      for (int64_t b = 0; b < (n_kv + bs - 1) / bs; ++b) {
        table[s * max_blocks + b] = perm[s * max_blocks + b];
      }
      const auto qs = a.round(random_values(n * heads * hd, 35 + 3 * s, 2.f));
      const auto ks = a.round(random_values(n_kv * kvd, 36 + 3 * s, 2.f));
      const auto vs = a.round(random_values(n_kv * kvd, 37 + 3 * s));
      vmax = std::max(vmax, max_abs(vs));
      for (int64_t p = 0; p < n_kv; ++p) {
        const int64_t slot = table[s * max_blocks + p / bs] * bs + p % bs;
        std::copy_n(ks.begin() + p * kvd, kvd, kpool.begin() + slot * kvd);
        std::copy_n(vs.begin() + p * kvd, kvd, vpool.begin() + slot * kvd);
        if (p >= seqs[s].first) {  // this step's tokens
          seq_of.push_back(static_cast<int32_t>(s));
          pos_of.push_back(static_cast<int32_t>(p));
        }
      }
      q_all.insert(q_all.end(), qs.begin(), qs.end());
      std::vector<float> out(qs.size());
      ops::ref::attention_causal(qs.data(), n, seqs[s].first, ks.data(), vs.data(), heads, kv_heads,
                                 hd, scale(), out.data());
      want.insert(want.end(), out.begin(), out.end());
    }
    q = upload(a.encode(q_all));
    k_cache = upload(a.encode(kpool));
    v_cache = upload(a.encode(vpool));
    tok_seq = upload_ints(seq_of);
    tok_pos = upload_ints(pos_of);
    tables = upload_ints(table);
  }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(hd)); }
  const int32_t* seq_ptr() const { return static_cast<const int32_t*>(tok_seq.data()); }
  const int32_t* pos_ptr() const { return static_cast<const int32_t*>(tok_pos.data()); }
  const int32_t* table_ptr() const { return static_cast<const int32_t*>(tables.data()); }
  // got against the reference (expect_attention_close over max_seen keys).
  void check(const Act& a, const std::vector<float>& got, float extra) const {
    expect_attention_close(a, got, want, max_seen, vmax, extra,
                           "heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) +
                               " head_dim " + std::to_string(hd));
  }
};

// A prefill chunk after cached tokens, a long decode step (split along the keys and merged) and
// a short one, through the warp-per-row kernel.
TEST_P(CudaOps, PagedAttentionMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  // A warp per GQA group of 4, 1 (MHA), 8 and 3 (not a power of two: a warp per head), with
  // head_dim 128, 64, 256 and 96.
  struct Shape {
    int64_t heads, kv_heads, hd;
  };
  for (const Shape& sh : {Shape{8, 2, 128}, Shape{4, 4, 64}, Shape{16, 2, 256}, Shape{6, 2, 96}}) {
    const PagedBatch b(a, sh.heads, sh.kv_heads, sh.hd, {{20, 7}, {1500, 1}, {3, 1}});
    ASSERT_GT(attention_splits(b.tokens * b.kv_heads, b.max_seen), 1);  // the long step splits
    DeviceBuffer dpart, dy;
    ASSERT_TRUE(DeviceBuffer::allocate(paged_attention_scratch_floats(b.hd) * 4, &dpart).ok());
    ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(b.want.size()), &dy).ok());
    ASSERT_TRUE(paged_attention(b.q.data(), b.tokens, b.seq_ptr(), b.pos_ptr(), b.table_ptr(),
                                b.max_blocks, b.bs, b.k_cache.data(), b.v_cache.data(), b.heads,
                                b.kv_heads, b.hd, b.scale(), b.max_seen,
                                static_cast<float*>(dpart.data()), dy.data(), a.t)
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    b.check(a, a.decode(download(dy)), 0.f);
  }
}

// The tensor-core prefill (BF16): long chunks cut into several 64-query tiles with a partial
// last one, after cached tokens and from position 0, a decode token in the same batch, GQA 4:1
// and 2:1, head_dim 128, 64 and 72 (padded to 80; 16-byte tile loads) and 36 (value by value).
// P is rounded to BF16 before P·V: up to 2^-8·max|v| more.
TEST(CudaFlash, PagedPrefillMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{DType::kBF16};
  struct Shape {
    int64_t heads, kv_heads, hd;
  };
  for (const Shape& sh : {Shape{8, 2, 128}, Shape{4, 1, 64}, Shape{4, 2, 72}, Shape{4, 2, 36}}) {
    const PagedBatch b(a, sh.heads, sh.kv_heads, sh.hd, {{37, 100}, {0, 70}, {300, 1}, {5, 64}});
    std::vector<int32_t> tiles(2 * b.tokens);
    const int64_t n_tiles = flash_query_tiles(b.chunk_off.data(), b.chunk_n.data(),
                                              static_cast<int64_t>(b.chunk_n.size()), tiles.data());
    ASSERT_EQ(n_tiles, 2 + 2 + 1 + 1);
    tiles.resize(2 * n_tiles);
    DeviceBuffer dtiles = upload_ints(tiles), dy;
    ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(b.want.size()), &dy).ok());
    ASSERT_TRUE(flash_attention_paged(b.q.data(), static_cast<const int32_t*>(dtiles.data()),
                                      n_tiles, b.seq_ptr(), b.pos_ptr(), b.table_ptr(),
                                      b.max_blocks, b.bs, b.k_cache.data(), b.v_cache.data(),
                                      b.heads, b.kv_heads, b.hd, b.scale(), dy.data())
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    b.check(a, a.decode(download(dy)), b.vmax / 256);
  }
}

// The vision tower's bidirectional attention on the tensor cores: one frame of 150 patches (three
// tiles, the last partial), head_dim 72 (the 8B tower's) and 64 (2B/4B).
TEST(CudaFlash, FullAttentionMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{DType::kBF16};
  for (int64_t hd : {72, 64}) {
    const int64_t n = 150, heads = 4;
    const auto q = a.round(random_values(n * heads * hd, 60, 2.f));
    const auto k = a.round(random_values(n * heads * hd, 61, 2.f));
    const auto v = a.round(random_values(n * heads * hd, 62));
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    std::vector<float> want(q.size());
    ops::ref::attention_full(q.data(), k.data(), v.data(), n, heads, hd, scale, want.data());
    DeviceBuffer dq = upload(a.encode(q)), dk = upload(a.encode(k)), dv = upload(a.encode(v)), dy;
    ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(q.size()), &dy).ok());
    ASSERT_TRUE(
        flash_attention_full(dq.data(), dk.data(), dv.data(), n, heads, hd, scale, dy.data()).ok());
    ASSERT_TRUE(synchronize().ok());
    const float vmax = max_abs(v);
    expect_attention_close(a, a.decode(download(dy)), want, n, vmax, vmax / 256,
                           "head_dim " + std::to_string(hd));
  }
}

TEST_P(CudaOps, EmbeddingGatherCopiesRows) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t vocab = 50, n = 300;
  const auto table = random_values(vocab * n, 8);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23};
  std::vector<uint8_t> id_bytes(ids.size() * 4);
  std::memcpy(id_bytes.data(), ids.data(), id_bytes.size());
  DeviceBuffer dt = upload(Act{DType::kBF16}.encode(table)), di = upload(id_bytes), dy;
  ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(ids.size() * n), &dy).ok());
  ASSERT_TRUE(embedding_gather(dt.data(), DType::kBF16, static_cast<const int32_t*>(di.data()),
                               static_cast<int64_t>(ids.size()), n, dy.data(), a.t)
                  .ok());
  ASSERT_TRUE(synchronize().ok());
  const auto rounded = Act{DType::kBF16}.round(table);
  std::vector<float> want;
  for (int32_t id : ids) {
    want.insert(want.end(), rounded.begin() + id * n, rounded.begin() + (id + 1) * n);
  }
  EXPECT_EQ(a.decode(download(dy)), want);  // BF16 values are exact in both types
}

// The vision encoder's bidirectional attention (with GQA for generality) against the
// double-precision reference (expect_attention_close's bound).
TEST_P(CudaOps, AttentionMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  struct Case {
    int64_t n, heads, kv_heads, head_dim;
  };
  for (const Case& c : {Case{9, 4, 2, 64}, Case{5, 2, 1, 256},
                        Case{6, 2, 1, 16},  // head_dim under a warp (tiny fixture)
                        Case{23, 4, 4, 32}, Case{64, 16, 16, 96}}) {
    const auto q = a.round(random_values(c.n * c.heads * c.head_dim, 16, 2.f));
    const auto k = a.round(random_values(c.n * c.kv_heads * c.head_dim, 17, 2.f));
    const auto v = a.round(random_values(c.n * c.kv_heads * c.head_dim, 18));
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    // The reference takes one K/V head per head: repeat each KV head over its group.
    const int64_t group = c.heads / c.kv_heads;
    std::vector<float> kr(q.size()), vr(q.size());
    for (int64_t i = 0; i < c.n; ++i) {
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const int64_t src = (i * c.kv_heads + h / group) * c.head_dim + d;
          kr[(i * c.heads + h) * c.head_dim + d] = k[src];
          vr[(i * c.heads + h) * c.head_dim + d] = v[src];
        }
      }
    }
    std::vector<float> want(q.size());
    ops::ref::attention_full(q.data(), kr.data(), vr.data(), c.n, c.heads, c.head_dim, scale,
                             want.data());
    DeviceBuffer dq = upload(a.encode(q)), dk = upload(a.encode(k)), dv = upload(a.encode(v)), dy;
    ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(q.size()), &dy).ok());
    ASSERT_TRUE(attention_full(dq.data(), dk.data(), dv.data(), c.n, c.heads, c.kv_heads,
                               c.head_dim, scale, dy.data(), a.t)
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    expect_attention_close(a, a.decode(download(dy)), want, c.n, max_abs(v), 0.f,
                           "n " + std::to_string(c.n) + " heads " + std::to_string(c.heads) + "/" +
                               std::to_string(c.kv_heads) + " head_dim " +
                               std::to_string(c.head_dim));
  }
}

// Greedy sampling: the first largest logit of each row, as std::max_element picks it, with ties
// and NaN planted.
TEST(CudaSampling, ArgmaxRowsPicksTheFirstLargest) {
  SKIP_WITHOUT_DEVICE();
  const int64_t rows = 6, n = 151936;  // Qwen3's vocabulary
  auto logits = random_values(rows * n, 19, 3.f);
  logits[1 * n + 5] = logits[1 * n + 90000] = 100.f;         // a tie: the lower index wins
  logits[2 * n + 7] = std::nanf("");                         // NaN never wins
  logits[3 * n + n - 1] = 100.f;                             // the last element
  for (int64_t i = 0; i < n; ++i) logits[4 * n + i] = -1.f;  // all equal: index 0
  DeviceBuffer dl = upload_f32(logits), di;
  ASSERT_TRUE(DeviceBuffer::allocate(rows * 4, &di).ok());
  ASSERT_TRUE(
      argmax_rows(static_cast<const float*>(dl.data()), rows, n, static_cast<int32_t*>(di.data()))
          .ok());
  ASSERT_TRUE(synchronize().ok());
  std::vector<int32_t> got(rows);
  ASSERT_TRUE(di.download(got.data(), rows * 4).ok());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t want = -1;
    for (int64_t i = 0; i < n; ++i) {
      const float x = logits[r * n + i];
      if (!std::isnan(x) && (want < 0 || x > logits[r * n + want])) want = i;
    }
    EXPECT_EQ(got[r], want) << "row " << r;
  }
}

// The weights' device bytes are made on the host: these run without a GPU too.
TEST(CudaWeights, DeviceBytesConvertAsTorchCasts) {
  // 1 + 3·2^-8 is a BF16 tie whose even neighbour is the upper one (truncation would go down).
  const std::vector<float> f32 = {1.f, -2.5f, 1.01171875f, 3.14159f, 0.f, -1e-30f};
  TensorView w{vlm::DType::kF32, {2, 3}, f32.data()};
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(device_bytes(w, DType::kBF16, &bytes).ok());
  ASSERT_EQ(bytes.size(), 12u);
  for (size_t i = 0; i < f32.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    EXPECT_EQ(h, f32_to_bf16(f32[i])) << i;
  }
  uint16_t tie;
  std::memcpy(&tie, bytes.data() + 4, 2);
  EXPECT_EQ(bf16_to_f32(tie), 1.015625f);
  ASSERT_TRUE(device_bytes(w, DType::kF32, &bytes).ok());
  EXPECT_EQ(std::memcmp(bytes.data(), f32.data(), bytes.size()), 0);

  std::vector<uint16_t> bf16(f32.size()), f16(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) {
    bf16[i] = f32_to_bf16(f32[i]);
    f16[i] = f32_to_f16(f32[i]);
  }
  ASSERT_TRUE(
      device_bytes(TensorView{vlm::DType::kBF16, {6}, bf16.data()}, DType::kBF16, &bytes).ok());
  EXPECT_EQ(std::memcmp(bytes.data(), bf16.data(), bytes.size()), 0);  // copied as stored
  ASSERT_TRUE(
      device_bytes(TensorView{vlm::DType::kF16, {6}, f16.data()}, DType::kF32, &bytes).ok());
  for (size_t i = 0; i < f16.size(); ++i) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    EXPECT_EQ(v, f16_to_f32(f16[i])) << i;
  }
  const std::vector<int8_t> i8(6, 1);
  const Status s = device_bytes(TensorView{vlm::DType::kI8, {6}, i8.data()}, DType::kBF16, &bytes);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("I8"), std::string::npos) << s.message();
}

TEST(CudaWeights, UploadRoundTrips) {
  SKIP_WITHOUT_DEVICE();
  const auto f32 = random_values(1000, 20);
  DeviceBuffer d;
  ASSERT_TRUE(
      upload_tensor(TensorView{vlm::DType::kF32, {10, 100}, f32.data()}, DType::kBF16, &d).ok());
  EXPECT_EQ(Act{DType::kBF16}.decode(download(d)), Act{DType::kBF16}.round(f32));
}

// Shapes are checked on the host, before any launch: this one runs without a GPU too.
TEST(CudaAttention, RejectsBadShapes) {
  EXPECT_FALSE(attention_full(nullptr, nullptr, nullptr, 1, 4, 2, 320, 1.f, nullptr, DType::kF32)
                   .ok());  // head_dim over 256
  EXPECT_FALSE(attention_full(nullptr, nullptr, nullptr, 1, 4, 3, 64, 1.f, nullptr, DType::kF32)
                   .ok());  // heads not a multiple of KV heads
  EXPECT_FALSE(paged_attention(nullptr, 1, nullptr, nullptr, nullptr, 1, 16, nullptr, nullptr, 4, 2,
                               512, 1.f, 1, nullptr, nullptr, DType::kF32)
                   .ok());
  EXPECT_FALSE(paged_attention(nullptr, 1, nullptr, nullptr, nullptr, 1, 0, nullptr, nullptr, 4, 2,
                               64, 1.f, 1, nullptr, nullptr, DType::kF32)
                   .ok());  // block 0
  // A long decode step is split only when the batch leaves warps idle.
  EXPECT_EQ(attention_splits(32, 100), 1);
  EXPECT_GT(attention_splits(32, 8192), 1);
  EXPECT_EQ(attention_splits(4096, 8192), 1);
  EXPECT_FALSE(flash_attention_paged(nullptr, nullptr, 1, nullptr, nullptr, nullptr, 1, 16, nullptr,
                                     nullptr, 4, 2, 256, 1.f, nullptr)
                   .ok());  // > 128
  EXPECT_FALSE(flash_attention_paged(nullptr, nullptr, 1, nullptr, nullptr, nullptr, 1, 16, nullptr,
                                     nullptr, 4, 3, 128, 1.f, nullptr)
                   .ok());  // GQA
  // Query tiles: runs of up to 64 tokens of one chunk.
  const int64_t off[] = {0, 130, 131}, n[] = {130, 1, 64};
  int32_t tiles[2 * 5];
  ASSERT_EQ(flash_query_tiles(off, n, 3, tiles), 5);
  const int32_t want[] = {0, 64, 64, 64, 128, 2, 130, 1, 131, 64};
  EXPECT_TRUE(std::equal(tiles, tiles + 10, want));
}

// y = x·Wᵀ through cuBLAS against a double-precision product of the same inputs: y in the
// parameter's type, from BF16 inputs, and for an F32 y from F32 inputs too. Bound: f32 sums in any
// order are within (K + 2)·u·Σ|x·w| of exact (F32 inputs: the products' roundings too, and never
// TF32), plus, for a BF16 y, one BF16 ulp.
void check_gemm(Gemm& gemm, const Act& in, const Act& y_t) {
  for (int64_t M : {1, 7, 64}) {
    for (int64_t N : {1, 33, 256}) {
      for (int64_t K : {64, 136, 1024}) {
        const auto x = in.round(random_values(M * K, 14));
        const auto w = in.round(random_values(N * K, 15, 0.05f));
        DeviceBuffer dx = upload(in.encode(x)), dw = upload(in.encode(w)), dy;
        ASSERT_TRUE(DeviceBuffer::allocate(y_t.bytes(M * N), &dy).ok());
        ASSERT_TRUE(gemm.matmul(dx.data(), dw.data(), in.t, M, N, K, dy.data(), y_t.t).ok());
        ASSERT_TRUE(synchronize().ok());
        const auto got = y_t.decode(download(dy));
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            double exact = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              exact += static_cast<double>(x[i * K + k]) * w[j * K + k];
              mag += std::fabs(static_cast<double>(x[i * K + k]) * w[j * K + k]);
            }
            const double bound = (K + 3) * static_cast<double>(kU) * mag +
                                 (y_t.t == DType::kBF16 ? std::fabs(exact) / 128 : 0.0) + 1e-7;
            ASSERT_LE(std::fabs(got[i * N + j] - exact), bound)
                << (in.t == DType::kF32 ? "F32" : "BF16") << " inputs, M " << M << " N " << N
                << " K " << K << " at (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

TEST_P(CudaOps, GemmMatchesAnExactProduct) {
  SKIP_WITHOUT_DEVICE();
  const Act y_t{GetParam()};
  std::unique_ptr<Gemm> gemm;
  ASSERT_TRUE(Gemm::create(&gemm).ok());
  check_gemm(*gemm, Act{DType::kBF16}, y_t);
  if (y_t.t == DType::kF32) check_gemm(*gemm, Act{DType::kF32}, y_t);
}

// The host Sampler's filters in double: penalties, temperature, top-k (ties with the k-th kept),
// softmax, the shortest top-p prefix by falling logit, min-p; the kept tokens' probabilities,
// renormalised (0 elsewhere).
std::vector<double> host_distribution(std::vector<float> l, const SampleParams& p,
                                      const std::vector<PenaltyEntry>& pens) {
  for (const PenaltyEntry& e : pens) {
    l[e.id] = l[e.id] < 0 ? l[e.id] * e.repetition : l[e.id] / e.repetition;
    l[e.id] -= e.subtract;
  }
  const int64_t V = static_cast<int64_t>(l.size());
  std::vector<int32_t> idx(V);
  for (int64_t i = 0; i < V; ++i) idx[i] = static_cast<int32_t>(i);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  int64_t n = V;
  if (p.top_k > 0 && p.top_k < V) {
    n = p.top_k;
    while (n < V && l[idx[n]] == l[idx[p.top_k - 1]]) ++n;
  }
  std::vector<double> q(V, 0.0), w(n);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) {
    w[i] = std::exp((l[idx[i]] - l[idx[0]]) * static_cast<double>(p.inv_temperature));
    z += w[i];
  }
  int64_t keep = n;
  if (p.top_p < 1) {
    double cum = 0;
    for (int64_t i = 0; i < n; ++i) {
      cum += w[i] / z;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  int64_t kept = 1;
  while (kept < keep && w[kept] >= p.min_p) ++kept;
  double total = 0;
  for (int64_t i = 0; i < kept; ++i) total += w[i];
  for (int64_t i = 0; i < kept; ++i) q[idx[i]] = w[i] / total;
  return q;
}

// Draws on the device at N stratified u = (j + 0.5) / N: walking the kept tokens in id order,
// token i is drawn N·q_i times give or take one, where q is the host's filtered distribution,
// and never outside the host's kept set. Penalties, temperature, top-k, top-p, min-p and greedy
// (top-k 1) each change the set.
TEST(CudaSampling, DrawsFollowTheHostSamplersFilters) {
  SKIP_WITHOUT_DEVICE();
  const int64_t V = 1000, N = 4000;
  const auto logits = random_values(V, 80, 2.f);
  std::vector<PenaltyEntry> pens;
  for (int32_t id : {3, 17, 250, 999}) pens.push_back({id, 1.3f, id == 17 ? 0.5f : 0.f});
  struct Case {
    int32_t top_k;
    float inv_t, top_p, min_p;
    bool penalised;
  };
  for (const Case& c : {Case{0, 1.f, 1.f, 0.f, false}, Case{0, 1.f / 0.7f, 1.f, 0.f, true},
                        Case{20, 1.f, 1.f, 0.f, false}, Case{0, 1.f, 0.8f, 0.f, false},
                        Case{50, 1.f / 1.3f, 0.9f, 0.05f, true}, Case{1, 1.f, 1.f, 0.f, true}}) {
    std::vector<float> rows;
    std::vector<SampleParams> params(N);
    std::vector<PenaltyEntry> all_pens;
    for (int64_t j = 0; j < N; ++j) {
      rows.insert(rows.end(), logits.begin(), logits.end());
      SampleParams& p = params[j];
      p.row = static_cast<int32_t>(j);
      p.top_k = c.top_k;
      p.inv_temperature = c.inv_t;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.u = (static_cast<float>(j) + 0.5f) / N;
      p.penalty_begin = static_cast<int32_t>(all_pens.size());
      if (c.penalised) all_pens.insert(all_pens.end(), pens.begin(), pens.end());
      p.penalty_end = static_cast<int32_t>(all_pens.size());
    }
    if (all_pens.empty()) all_pens.push_back({0, 1.f, 0.f});  // a buffer to point at
    const auto q =
        host_distribution(logits, params[0], c.penalised ? pens : std::vector<PenaltyEntry>{});
    std::vector<uint8_t> pb(params.size() * sizeof(SampleParams));
    std::vector<uint8_t> eb(all_pens.size() * sizeof(PenaltyEntry));
    std::memcpy(pb.data(), params.data(), pb.size());
    std::memcpy(eb.data(), all_pens.data(), eb.size());
    DeviceBuffer dl = upload_f32(rows), dp = upload(pb), de = upload(eb), dids;
    ASSERT_TRUE(DeviceBuffer::allocate(N * 4, &dids).ok());
    ASSERT_TRUE(sample_rows(static_cast<float*>(dl.data()), V,
                            static_cast<const SampleParams*>(dp.data()), N,
                            static_cast<const PenaltyEntry*>(de.data()),
                            static_cast<int32_t*>(dids.data()))
                    .ok());
    ASSERT_TRUE(synchronize().ok());
    const auto bytes = download(dids);
    std::vector<int64_t> count(V, 0);
    for (int64_t j = 0; j < N; ++j) {
      int32_t id;
      std::memcpy(&id, bytes.data() + 4 * j, 4);
      ASSERT_TRUE(id >= 0 && id < V) << id;
      ++count[id];
    }
    for (int64_t i = 0; i < V; ++i) {
      if (q[i] == 0) {
        ASSERT_EQ(count[i], 0) << "token " << i << " is filtered out on the host";
      } else {
        ASSERT_LE(std::fabs(static_cast<double>(count[i]) - N * q[i]), 1.5 + N * 1e-4)
            << "token " << i << " top_k " << c.top_k << " top_p " << c.top_p;
      }
    }
  }
}

// Weight-only INT8 (--quant int8): the direct kernel (M up to 8) and the dequantize + cuBLAS path
// (larger M, several row blocks when N·K passes the scratch), against a double product of x and
// the dequantized weights q·s. Bound as GemmMatchesAnExactProduct, plus, where the dequantized
// weights are rounded to BF16 (BF16 x on the second path), 2^-8·Σ|x·q·s|.
TEST_P(CudaOps, Int8MatmulMatchesAnExactProduct) {
  SKIP_WITHOUT_DEVICE();
  const Act x_t{GetParam()};
  std::unique_ptr<Gemm> gemm;
  ASSERT_TRUE(Gemm::create(&gemm).ok());
  DeviceBuffer scratch;
  ASSERT_TRUE(DeviceBuffer::allocate(kInt8ScratchElems * 4, &scratch).ok());
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape& sh : {Shape{1, 300, 4096}, Shape{3, 77, 128}, Shape{8, 64, 512},
                          Shape{40, 33, 256}, Shape{9, 4100, 8192}}) {
    std::mt19937 rng(70);
    std::uniform_int_distribution<int> qd(-127, 127);
    std::vector<int8_t> q(sh.N * sh.K);
    for (auto& v : q) v = static_cast<int8_t>(qd(rng));
    const auto scale = random_values(sh.N, 71, 0.01f);
    const auto x = x_t.round(random_values(sh.M * sh.K, 72));
    std::vector<uint8_t> qb(q.size());
    std::memcpy(qb.data(), q.data(), q.size());
    DeviceBuffer dx = upload(x_t.encode(x)), dq = upload(qb), ds = upload_f32(scale);
    for (const Act y_t : {Act{DType::kF32}, Act{DType::kBF16}}) {
      DeviceBuffer dy;
      ASSERT_TRUE(DeviceBuffer::allocate(y_t.bytes(sh.M * sh.N), &dy).ok());
      ASSERT_TRUE(int8_matmul(*gemm, dx.data(), x_t.t, static_cast<const int8_t*>(dq.data()),
                              static_cast<const float*>(ds.data()), sh.M, sh.N, sh.K, dy.data(),
                              y_t.t, scratch.data())
                      .ok());
      ASSERT_TRUE(synchronize().ok());
      const auto got = y_t.decode(download(dy));
      const bool rounded_w = sh.M > kInt8DirectRows && x_t.t == DType::kBF16;
      for (int64_t i = 0; i < sh.M; ++i) {
        for (int64_t j = 0; j < sh.N; ++j) {
          double exact = 0, mag = 0;
          for (int64_t k = 0; k < sh.K; ++k) {
            const double w = static_cast<double>(q[j * sh.K + k]) * scale[j];
            exact += x[i * sh.K + k] * w;
            mag += std::fabs(x[i * sh.K + k] * w);
          }
          const double bound = (sh.K + 3) * static_cast<double>(kU) * mag +
                               (rounded_w ? mag / 256 : 0.0) +
                               (y_t.t == DType::kBF16 ? std::fabs(exact) / 128 : 0.0) + 1e-7;
          ASSERT_LE(std::fabs(got[i * sh.N + j] - exact), bound)
              << "M " << sh.M << " N " << sh.N << " K " << sh.K << " at (" << i << ", " << j << ")";
        }
      }
    }
  }
}

// --quant fp8: both operands quantized on the device to E4M3 with a per-tensor scale (max|v| /
// 448), then the cuBLASLt FP8 product in BF16. Checked against a double product of the values
// quantized on the host with the same conversion: the scales must agree exactly, the product to
// (K + 3)·u·Σ|x̂ŵ| plus one BF16 ulp.
TEST(CudaFp8, QuantizedProductMatchesTheQuantizedValues) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<Gemm> gemm;
  ASSERT_TRUE(Gemm::create(&gemm).ok());
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape& sh : {Shape{1, 256, 4096}, Shape{16, 96, 128}, Shape{40, 512, 1024}}) {
    const Act bf{DType::kBF16};
    const auto x = bf.round(random_values(sh.M * sh.K, 90));
    const auto w = bf.round(random_values(sh.N * sh.K, 91, 0.05f));
    auto quantize = [](const std::vector<float>& v, float* scale) {
      float amax = 0.f;
      for (float f : v) amax = std::max(amax, std::fabs(f));
      *scale = amax > 0 ? amax / 448.f : 1.f;
      const float inv = 1.f / *scale;
      std::vector<float> q(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const __nv_fp8_storage_t b = __nv_cvt_float_to_fp8(v[i] * inv, __NV_SATFINITE, __NV_E4M3);
        q[i] = static_cast<float>(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
      }
      return q;
    };
    float sx = 0, sw = 0;
    const auto qx = quantize(x, &sx), qw = quantize(w, &sw);
    DeviceBuffer dx = upload(bf.encode(x)), dw = upload(bf.encode(w)), dqx, dqw, dsc, dy;
    ASSERT_TRUE(DeviceBuffer::allocate(x.size(), &dqx).ok());
    ASSERT_TRUE(DeviceBuffer::allocate(w.size(), &dqw).ok());
    ASSERT_TRUE(DeviceBuffer::allocate(4 * 4, &dsc).ok());
    ASSERT_TRUE(DeviceBuffer::allocate(bf.bytes(sh.M * sh.N), &dy).ok());
    float* sc = static_cast<float*>(dsc.data());  // amax x | scale x | amax w | scale w
    ASSERT_TRUE(quantize_fp8(dx.data(), DType::kBF16, sh.M * sh.K, sc, sc + 1, dqx.data()).ok());
    ASSERT_TRUE(
        quantize_fp8(dw.data(), DType::kBF16, sh.N * sh.K, sc + 2, sc + 3, dqw.data()).ok());
    ASSERT_TRUE(
        gemm->matmul_fp8(dqx.data(), sc + 1, dqw.data(), sc + 3, sh.M, sh.N, sh.K, dy.data()).ok());
    ASSERT_TRUE(synchronize().ok());
    std::vector<float> scales(4);
    const auto sb = download(dsc);
    std::memcpy(scales.data(), sb.data(), 16);
    ASSERT_EQ(scales[1], sx);
    ASSERT_EQ(scales[3], sw);
    const auto got = bf.decode(download(dy));
    for (int64_t i = 0; i < sh.M; ++i) {
      for (int64_t j = 0; j < sh.N; ++j) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < sh.K; ++k) {
          const double p = static_cast<double>(qx[i * sh.K + k]) * sx * qw[j * sh.K + k] * sw;
          exact += p;
          mag += std::fabs(p);
        }
        const double bound =
            (sh.K + 3) * static_cast<double>(kU) * mag + std::fabs(exact) / 128 + 1e-6;
        ASSERT_LE(std::fabs(got[i * sh.N + j] - exact), bound)
            << "M " << sh.M << " N " << sh.N << " K " << sh.K << " at (" << i << ", " << j << ")";
      }
    }
  }
}

// The router at the published width (128 experts, top-8): logits on a coarse grid, so that most
// rows have ties at the k-th place, and a NaN; the k best by (logit, then lower index), their
// softmax over all 128 in f32, renormalised or not.
TEST(CudaMoe, RouteTakesTheTopKWithTiesToTheLowerIndex) {
  SKIP_WITHOUT_DEVICE();
  const int64_t rows = 37, E = 128, k = 8;
  auto logits = random_values(rows * E, 71, 1.5f);
  for (auto& l : logits) l = std::round(l * 2) / 2;  // 0.5 steps: many equal logits
  logits[3 * E + 17] = NAN;                          // never chosen, rows stay valid
  DeviceBuffer dl = upload_f32(logits), dids, dw;
  ASSERT_TRUE(DeviceBuffer::allocate(rows * k * 4, &dids).ok());
  ASSERT_TRUE(DeviceBuffer::allocate(rows * k * 4, &dw).ok());
  for (bool renormalize : {true, false}) {
    ASSERT_TRUE(
        moe_route(dl.as<const float>(), rows, E, k, renormalize, dids.as<int32_t>(), dw.as<float>())
            .ok());
    ASSERT_TRUE(synchronize().ok());
    std::vector<int32_t> ids(rows * k);
    std::vector<float> w(rows * k);
    ASSERT_TRUE(dids.download(ids.data(), ids.size() * 4).ok());
    ASSERT_TRUE(dw.download(w.data(), w.size() * 4).ok());
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits.data() + r * E;
      std::vector<int32_t> order(E);
      for (int32_t e = 0; e < E; ++e) order[e] = e;
      const auto key = [&](int32_t e) { return std::isnan(l[e]) ? -INFINITY : l[e]; };
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return key(a) > key(b); });
      double m = key(order[0]), sum = 0, chosen = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::isnan(l[e]) ? 0 : std::exp(l[e] - m);
      for (int64_t j = 0; j < k; ++j) chosen += std::exp(l[order[j]] - m) / sum;
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(ids[r * k + j], order[j]) << "row " << r << " place " << j;
        if (r == 3) continue;  // the NaN row's softmax is NaN, as on the CPU
        const double p = std::exp(l[order[j]] - m) / sum / (renormalize ? chosen : 1.0);
        EXPECT_NEAR(w[r * k + j], p, 1e-5 * p + 1e-7) << "row " << r << " place " << j;
      }
    }
  }
}

// One expert stack as the device holds it: E weights [N, K] in the activation type, or INT8 with
// row scales, and the device tables of their pointers.
struct Experts {
  std::vector<std::vector<float>> w;  // the values the products use (rounded / dequantized)
  std::vector<DeviceBuffer> data, scales;
  DeviceBuffer w_table, s_table;
  MoeWeights view() const {
    return {w_table.as<const void* const>(),
            s_table.bytes() ? s_table.as<const float* const>() : nullptr, s_table.bytes() > 0};
  }
};

Experts make_experts(int64_t E, int64_t N, int64_t K, const Act& a, bool int8, uint32_t seed) {
  Experts x;
  std::vector<const void*> wp, sp;
  for (int64_t e = 0; e < E; ++e) {
    auto v = random_values(N * K, seed + static_cast<uint32_t>(e), 0.2f);
    if (int8) {
      std::vector<uint8_t> q(N * K);
      std::vector<float> s(N);
      for (int64_t n = 0; n < N; ++n) {
        float amax = 0;
        for (int64_t c = 0; c < K; ++c) amax = std::max(amax, std::fabs(v[n * K + c]));
        s[n] = amax / 127;
        for (int64_t c = 0; c < K; ++c) {
          const auto qi = static_cast<int8_t>(std::lround(v[n * K + c] / s[n]));
          q[n * K + c] = static_cast<uint8_t>(qi);
          v[n * K + c] = static_cast<float>(qi) * s[n];
        }
      }
      x.data.push_back(upload(q));
      x.scales.push_back(upload_f32(s));
      sp.push_back(x.scales.back().data());
    } else {
      v = a.round(v);
      x.data.push_back(upload(a.encode(v)));
    }
    wp.push_back(x.data.back().data());
    x.w.push_back(std::move(v));
  }
  const auto table = [&](const std::vector<const void*>& p) {
    std::vector<uint8_t> b(p.size() * sizeof(void*));
    std::memcpy(b.data(), p.data(), b.size());
    return upload(b);
  };
  x.w_table = table(wp);
  if (int8) x.s_table = table(sp);
  return x;
}

// The grouped expert products at the published width (128 experts, top-8) against a host
// reference with the device's roundings (gate|up and SwiGLU in the activation type): rows of 1
// (decode), 3, 37 and 300 (more than one tile per expert), N = 100 (not a multiple of the
// 8-column blocks), INT8 and activation-type weights.
TEST_P(CudaOps, MoeExpertsMatchTheReference) {
  SKIP_WITHOUT_DEVICE();
  const Act a{GetParam()};
  const int64_t E = 128, k = 8, n = 100, I = 40;
  for (bool int8 : {false, true}) {
    const Experts gate_up = make_experts(E, 2 * I, n, a, int8, 500);
    const Experts down = make_experts(E, n, I, a, int8, 900);
    for (int64_t rows : {1, 3, 37, 300}) {
      const int64_t pairs = rows * k;
      const auto x = a.round(random_values(rows * n, 31 + static_cast<uint32_t>(rows)));
      std::mt19937 rng(static_cast<uint32_t>(rows));
      std::vector<int32_t> ids(pairs);
      std::vector<float> wts(pairs);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t> all(E);
        for (int32_t e = 0; e < E; ++e) all[e] = e;
        std::shuffle(all.begin(), all.end(), rng);
        if (r % 5 == 0) {  // expert 7 in many rows: its group spans several tiles
          std::iter_swap(all.begin(), std::find(all.begin(), all.end(), 7));
          std::shuffle(all.begin(), all.begin() + k, rng);  // (the k stay distinct)
        }
        for (int64_t j = 0; j < k; ++j) {
          ids[r * k + j] = all[j];
          wts[r * k + j] = std::uniform_real_distribution<float>(0.05f, 1.f)(rng);
        }
      }
      // Reference: per pair gu = x · gate_upᵀ (rounded), h = silu(g) · u (rounded), y = h · downᵀ;
      // out[r] = Σ_j in expert order w · y (rounded once).
      std::vector<float> want(rows * n, 0.f);
      std::vector<double> mag(rows * n, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int64_t> js(k);
        for (int64_t j = 0; j < k; ++j) js[j] = j;
        std::sort(js.begin(), js.end(),
                  [&](int64_t p, int64_t q) { return ids[r * k + p] < ids[r * k + q]; });
        std::vector<double> acc(n, 0.0);
        for (int64_t j : js) {
          const int32_t e = ids[r * k + j];
          std::vector<float> gu(2 * I), h(I);
          for (int64_t o = 0; o < 2 * I; ++o) {
            double s = 0;
            for (int64_t c = 0; c < n; ++c) s += double{x[r * n + c]} * gate_up.w[e][o * n + c];
            gu[o] = static_cast<float>(s);
          }
          gu = a.round(gu);
          for (int64_t i = 0; i < I; ++i) h[i] = gu[i] / (1.f + std::exp(-gu[i])) * gu[I + i];
          h = a.round(h);
          for (int64_t d = 0; d < n; ++d) {
            double s = 0, sa = 0;
            for (int64_t i = 0; i < I; ++i) {
              s += double{h[i]} * down.w[e][d * I + i];
              sa += std::fabs(double{h[i]} * down.w[e][d * I + i]);
            }
            acc[d] += wts[r * k + j] * s;
            mag[r * n + d] += wts[r * k + j] * sa;
          }
        }
        for (int64_t d = 0; d < n; ++d) want[r * n + d] = static_cast<float>(acc[d]);
      }
      DeviceBuffer dx = upload(a.encode(x)), dids, dwts, scratch, out;
      std::vector<uint8_t> ib(pairs * 4), wb(pairs * 4);
      std::memcpy(ib.data(), ids.data(), ib.size());
      std::memcpy(wb.data(), wts.data(), wb.size());
      dids = upload(ib);
      dwts = upload(wb);
      const int64_t gu_bytes = a.bytes(pairs * 2 * I), h_bytes = a.bytes(pairs * I);
      const int64_t y_bytes = pairs * n * 4, g_bytes = moe_groups_bytes(E, pairs);
      ASSERT_TRUE(
          DeviceBuffer::allocate(gu_bytes + h_bytes + y_bytes + g_bytes + 1024, &scratch).ok());
      ASSERT_TRUE(DeviceBuffer::allocate(a.bytes(rows * n), &out).ok());
      char* base = scratch.as<char>();
      const auto up = [](int64_t b) { return (b + 255) / 256 * 256; };
      void* gu = base;
      void* h = base + up(gu_bytes);
      auto* y = reinterpret_cast<float*>(base + up(gu_bytes) + up(h_bytes));
      const MoeGroups g = moe_groups_at(base + up(gu_bytes) + up(h_bytes) + up(y_bytes), E, pairs);
      ASSERT_TRUE(moe_group(dids.as<const int32_t>(), pairs, E, g).ok());
      ASSERT_TRUE(moe_grouped_product(dx.data(), a.t, true, k, g, E, pairs, gate_up.view(), 2 * I,
                                      n, gu, a.t)
                      .ok());
      ASSERT_TRUE(silu_mul_rows(gu, pairs, I, h, a.t).ok());
      ASSERT_TRUE(
          moe_grouped_product(h, a.t, false, k, g, E, pairs, down.view(), n, I, y, DType::kF32)
              .ok());
      ASSERT_TRUE(moe_combine(y, dids.as<const int32_t>(), dwts.as<const float>(), rows, k, E, n,
                              out.data(), a.t)
                      .ok());
      ASSERT_TRUE(synchronize().ok());
      const auto got = a.decode(download(out));
      // Sums in another order, carried through SwiGLU into the down product: 1e-4 of the terms'
      // magnitude in f32 (a misplaced row or expert is off by about all of it); in BF16 an
      // intermediate may round to the neighbouring value (2^-8 of it) and the output once more.
      for (int64_t i = 0; i < rows * n; ++i) {
        const double bound = (a.t == DType::kF32 ? 1e-4 : 2e-2) * mag[i] +
                             (a.t == DType::kF32 ? 0 : std::fabs(want[i]) / 128) + 1e-6;
        ASSERT_LE(std::fabs(got[i] - want[i]), bound)
            << (int8 ? "int8" : "act") << " rows " << rows << " at " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, CudaOps, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) {
                           return info.param == DType::kF32 ? "F32" : "BF16";
                         });

}  // namespace
}  // namespace vlm::cuda
