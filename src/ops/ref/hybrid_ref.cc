// Scalar references of Qwen3.5's hybrid-layer ops (ref.h): token by token, in double, from the
// definitions in transformers' Qwen3_5GatedDeltaNet (torch_recurrent_gated_delta_rule) and
// Qwen3_5RMSNormGated. Never optimised.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/ref/ref.h"

namespace vlm::ops::ref {
namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// x[0, n) ← x · scale / sqrt(Σ x² + 1e-6).
void l2norm(double* x, int64_t n, double scale) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double f = scale / std::sqrt(ss + 1e-6);
  for (int64_t i = 0; i < n; ++i) x[i] *= f;
}

}  // namespace

void gated_delta_net(const float* proj, int64_t proj_stride, const DeltaNetSeq* seqs,
                     int64_t n_seqs, const DeltaNetShape& s, const float* conv_w,
                     const float* a_log, const float* dt_bias, float* out) {
  const int64_t C = s.conv_dim(), K = s.kernel, W = K - 1, od = s.nv * s.dv;
  const int64_t zb = C + s.nv * s.dv;
  for (int64_t i = 0; i < n_seqs; ++i) {
    const DeltaNetSeq& q = seqs[i];
    if (q.fresh) {
      std::fill_n(q.conv, s.conv_state(), 0.f);
      std::fill_n(q.state, s.recurrent_state(), 0.f);
    }
    std::vector<double> S(q.state, q.state + s.recurrent_state());
    std::vector<double> win(q.conv, q.conv + s.conv_state()), m(static_cast<size_t>(C));
    for (int64_t t = 0; t < q.len; ++t) {
      const float* x = proj + (q.row + t) * proj_stride;
      for (int64_t c = 0; c < C; ++c) {  // the conv over the window and this input, then SiLU
        double acc = conv_w[W * C + c] * static_cast<double>(x[c]);
        for (int64_t j = 0; j < W; ++j) acc += conv_w[j * C + c] * win[j * C + c];
        m[c] = silu(acc);
      }
      for (int64_t j = 0; j + 1 < W; ++j) std::copy_n(&win[(j + 1) * C], C, &win[j * C]);
      if (W > 0) std::copy_n(x, C, &win[(W - 1) * C]);
      for (int64_t h = 0; h < s.nk; ++h) {
        l2norm(&m[h * s.dk], s.dk, 1.0 / std::sqrt(static_cast<double>(s.dk)));
        l2norm(&m[(s.nk + h) * s.dk], s.dk, 1.0);
      }
      for (int64_t h = 0; h < s.nv; ++h) {
        const double* qv = &m[s.key_head(h) * s.dk];
        const double* kv = qv + s.nk * s.dk;
        const double* vv = &m[2 * s.nk * s.dk + h * s.dv];
        const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(x[zb + h])));
        const double g = -std::exp(static_cast<double>(a_log[h])) *
                         softplus(static_cast<double>(x[zb + s.nv + h]) + dt_bias[h]);
        double* Sh = &S[h * s.dk * s.dv];
        for (int64_t e = 0; e < s.dk * s.dv; ++e) Sh[e] *= std::exp(g);
        for (int64_t j = 0; j < s.dv; ++j) {
          double mem = 0;
          for (int64_t a = 0; a < s.dk; ++a) mem += Sh[a * s.dv + j] * kv[a];
          const double delta = (vv[j] - mem) * beta;
          for (int64_t a = 0; a < s.dk; ++a) Sh[a * s.dv + j] += kv[a] * delta;
          double o = 0;
          for (int64_t a = 0; a < s.dk; ++a) o += Sh[a * s.dv + j] * qv[a];
          out[(q.row + t) * od + h * s.dv + j] = static_cast<float>(o);
        }
      }
    }
    std::transform(S.begin(), S.end(), q.state, [](double v) { return static_cast<float>(v); });
    std::transform(win.begin(), win.end(), q.conv, [](double v) { return static_cast<float>(v); });
  }
}

void gated_rms_norm(const float* x, const float* z, int64_t z_stride, int64_t rows, int64_t heads,
                    int64_t n, const float* w, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* xr = x + (r * heads + h) * n;
      const float* zr = z + r * z_stride + h * n;
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
      for (int64_t i = 0; i < n; ++i) {
        y[(r * heads + h) * n + i] = static_cast<float>(xr[i] * inv * w[i] * silu(zr[i]));
      }
    }
  }
}

void qk_norm_rope_partial(float* x, int64_t n_heads, int64_t head_stride, int64_t head_dim,
                          int64_t rotary_dim, const float* w, float eps, const float* cos,
                          const float* sin) {
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_stride;
    rms_norm(v, w, 1, head_dim, eps, v);
    for (int64_t d = 0; d < half; ++d) {
      const float a = v[d], b = v[d + half];
      v[d] = a * cos[d] - b * sin[d];
      v[d + half] = b * cos[d] + a * sin[d];
    }
  }
}

}  // namespace vlm::ops::ref
