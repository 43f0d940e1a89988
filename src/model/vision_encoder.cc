#include "model/vision_encoder.h"

#include <algorithm>
#include <cmath>

namespace vlm {

namespace {

// nn.LayerNorm(eps=1e-6) in every block and merger of the tower (not in the config).
constexpr float kLayerNormEps = 1e-6f;

Status check_grid(const GridThw& g, int64_t m) {
  if (g.t < 1 || g.h < m || g.w < m || g.h % m != 0 || g.w % m != 0) {
    return invalid_argument("image grid (" + std::to_string(g.t) + ", " + std::to_string(g.h) +
                            ", " + std::to_string(g.w) +
                            ") is not a positive multiple of the merge size");
  }
  return ok_status();
}

int64_t total_patches(const std::vector<GridThw>& grids) {
  int64_t S = 0;
  for (const GridThw& g : grids) S += g.patches();
  return S;
}

}  // namespace

VisionEncoder::VisionEncoder(const Qwen3VLConfig& cfg, const VisionWeights& w, ops::Backend& be,
                             bool fp16, std::optional<ops::Bf16Gemm> bf16_gemm)
    : cfg_(cfg.vision_config), w_(w), be_(be), fp16_(fp16), bf16_gemm_(bf16_gemm) {
  grid_side_ = static_cast<int64_t>(
      std::llround(std::sqrt(static_cast<double>(cfg_.num_position_embeddings))));
  // Qwen3VLVisionRotaryEmbedding(dim = head_dim / 2): inv_freq = 10000^(-2i / dim), i < dim / 2,
  // computed in float32 as torch does.
  const int64_t head_dim = cfg_.hidden_size / cfg_.num_heads;
  const int64_t dim = head_dim / 2;
  inv_freq_.resize(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv_freq_[i] = 1.0f / std::pow(10000.0f, e);
  }
}

Result<std::unique_ptr<VisionEncoder>> VisionEncoder::create(
    const Qwen3VLConfig& cfg, const VisionWeights& w, ops::Backend& be, bool fp16,
    std::optional<ops::Bf16Gemm> bf16_gemm) {
  std::unique_ptr<VisionEncoder> e(new VisionEncoder(cfg, w, be, fp16, bf16_gemm));
  VLM_RETURN_IF_ERROR(e->init());
  return e;
}

Status VisionEncoder::init() {
  VLM_RETURN_IF_ERROR(be_.reserve_attention(cfg_.hidden_size / cfg_.num_heads));
  ops::LinearOptions o;
  o.fp16_arithmetic = fp16_;
  o.bf16_gemm = bf16_gemm_;
  auto linear = [&](const TensorView& t, const std::string& name,
                    std::unique_ptr<ops::Linear>* out) -> Status {
    const TensorView* ws[] = {&t};
    VLM_ASSIGN_OR_RETURN(*out, be_.linear(ws, o).with_context(name));
    return ok_status();
  };
  VLM_RETURN_IF_ERROR(linear(w_.patch_embed, "patch_embed", &patch_));
  VLM_ASSIGN_OR_RETURN(patch_b_, be_.vector(w_.patch_embed_b));
  blocks_.resize(w_.blocks.size());
  for (size_t i = 0; i < w_.blocks.size(); ++i) {
    const VisionBlockWeights& s = w_.blocks[i];
    Block& d = blocks_[i];
    const std::string at = "vision block " + std::to_string(i);
    for (auto [src, dst] : {std::pair{&s.norm1_w, &d.norm1_w},
                            {&s.norm1_b, &d.norm1_b},
                            {&s.qkv_b, &d.qkv_b},
                            {&s.proj_b, &d.proj_b},
                            {&s.norm2_w, &d.norm2_w},
                            {&s.norm2_b, &d.norm2_b},
                            {&s.fc1_b, &d.fc1_b},
                            {&s.fc2_b, &d.fc2_b}}) {
      VLM_ASSIGN_OR_RETURN(*dst, be_.vector(*src));
    }
    VLM_RETURN_IF_ERROR(linear(s.qkv, at + " qkv", &d.qkv));
    VLM_RETURN_IF_ERROR(linear(s.proj, at + " proj", &d.proj));
    VLM_RETURN_IF_ERROR(linear(s.fc1, at + " fc1", &d.fc1));
    VLM_RETURN_IF_ERROR(linear(s.fc2, at + " fc2", &d.fc2));
  }
  VLM_RETURN_IF_ERROR(load_merger(w_.merger, &merger_));
  deepstack_.resize(w_.deepstack_mergers.size());
  for (size_t i = 0; i < w_.deepstack_mergers.size(); ++i) {
    VLM_RETURN_IF_ERROR(load_merger(w_.deepstack_mergers[i], &deepstack_[i]));
  }
  return be_.synchronize();
}

Status VisionEncoder::load_merger(const VisionMergerWeights& s, Merger* d) {
  ops::LinearOptions o;
  o.fp16_arithmetic = fp16_;
  o.bf16_gemm = bf16_gemm_;
  VLM_ASSIGN_OR_RETURN(d->norm_w, be_.vector(s.norm_w));
  VLM_ASSIGN_OR_RETURN(d->norm_b, be_.vector(s.norm_b));
  VLM_ASSIGN_OR_RETURN(d->fc1_b, be_.vector(s.fc1_b));
  VLM_ASSIGN_OR_RETURN(d->fc2_b, be_.vector(s.fc2_b));
  const TensorView* fc1[] = {&s.fc1};
  const TensorView* fc2[] = {&s.fc2};
  VLM_ASSIGN_OR_RETURN(d->fc1, be_.linear(fc1, o).with_context("merger fc1"));
  VLM_ASSIGN_OR_RETURN(d->fc2, be_.linear(fc2, o).with_context("merger fc2"));
  return ok_status();
}

// fast_pos_embed_interpolate: bilinear sampling of the learned grid_side × grid_side table with
// align_corners semantics (torch.linspace(0, side − 1, n)), then reordered to merge order and
// repeated for every temporal group.
void VisionEncoder::add_position_embedding(const GridThw& g, float* x) const {
  const int64_t D = cfg_.hidden_size, side = grid_side_, m = cfg_.spatial_merge_size;
  auto linspace = [&](int64_t n, int64_t i) -> float {
    if (n == 1) return 0.f;
    // torch.linspace in float32: start + i·step for the first half, end − (n−1−i)·step after.
    const float step = static_cast<float>(side - 1) / static_cast<float>(n - 1);
    return i < n / 2 ? static_cast<float>(i) * step
                     : static_cast<float>(side - 1) - static_cast<float>(n - 1 - i) * step;
  };
  const int64_t per_frame = g.h * g.w;
  for (int64_t i = 0; i < g.h; ++i) {
    const float yi = linspace(g.h, i);
    const int64_t y0 = static_cast<int64_t>(yi), y1 = std::min(y0 + 1, side - 1);
    const float dy = yi - static_cast<float>(y0);
    for (int64_t j = 0; j < g.w; ++j) {
      const float xj = linspace(g.w, j);
      const int64_t x0 = static_cast<int64_t>(xj), x1 = std::min(x0 + 1, side - 1);
      const float dx = xj - static_cast<float>(x0);
      const float w00 = (1 - dy) * (1 - dx), w01 = (1 - dy) * dx, w10 = dy * (1 - dx),
                  w11 = dy * dx;
      const float* e00 = w_.pos_embed.data() + (y0 * side + x0) * D;
      const float* e01 = w_.pos_embed.data() + (y0 * side + x1) * D;
      const float* e10 = w_.pos_embed.data() + (y1 * side + x0) * D;
      const float* e11 = w_.pos_embed.data() + (y1 * side + x1) * D;
      // Raster patch (i, j) sits at this row in merge order.
      const int64_t row = ((i / m) * (g.w / m) + j / m) * m * m + (i % m) * m + (j % m);
      for (int64_t t = 0; t < g.t; ++t) {
        float* xr = x + (t * per_frame + row) * D;
        for (int64_t d = 0; d < D; ++d) {
          xr[d] += ((e00[d] * w00 + e01[d] * w01) + e10[d] * w10) + e11[d] * w11;
        }
      }
    }
  }
}

// rot_pos_emb: each patch row has (row, col) in unmerged patch units; the first half of the
// rotary angles uses row · inv_freq, the second col · inv_freq. Same for every temporal group.
void VisionEncoder::rotary_tables(const GridThw& g, std::vector<float>* cos,
                                  std::vector<float>* sin) const {
  const int64_t m = cfg_.spatial_merge_size, q = static_cast<int64_t>(inv_freq_.size());
  const int64_t half = 2 * q;  // head_dim / 2 angles per patch
  const int64_t per_frame = g.h * g.w;
  const size_t base = cos->size();
  cos->resize(base + g.patches() * half);
  sin->resize(base + g.patches() * half);
  for (int64_t r = 0; r < per_frame; ++r) {
    const int64_t block = r / (m * m), intra = r % (m * m);
    const int64_t row = (block / (g.w / m)) * m + intra / m;
    const int64_t col = (block % (g.w / m)) * m + intra % m;
    for (int64_t t = 0; t < g.t; ++t) {
      float* c = cos->data() + base + (t * per_frame + r) * half;
      float* s = sin->data() + base + (t * per_frame + r) * half;
      for (int64_t i = 0; i < q; ++i) {
        const float a = static_cast<float>(row) * inv_freq_[i];
        const float b = static_cast<float>(col) * inv_freq_[i];
        c[i] = std::cos(a);
        s[i] = std::sin(a);
        c[q + i] = std::cos(b);
        s[q + i] = std::sin(b);
      }
    }
  }
}

Status VisionEncoder::grow(ops::Buffer* b, int64_t elems, DType t) {
  if (b->bytes() >= dtype_nbytes(t, elems) && b->buf().dtype == t) return ok_status();
  *b = {};
  VLM_ASSIGN_OR_RETURN(*b, be_.alloc(elems, t));
  return ok_status();
}

void VisionEncoder::release_host_scratch() {
  if (be_.device() != ops::Device::kCpu) return;
  for (ops::Buffer* b : {&pix_, &pix_act_, &rgb_, &lut_, &pos_, &cos_, &sin_, &x_, &xn_, &tmp_,
                         &qkv_, &q_, &k_, &v_, &attn_, &mlp_, &m_norm_, &m_hidden_, &m_out_}) {
    *b = {};
  }
  for (auto* v : {&h_pos_, &h_cos_, &h_sin_}) std::vector<float>().swap(*v);
}

Status VisionEncoder::prepare(const std::vector<GridThw>& grids) {
  const int64_t m = cfg_.spatial_merge_size;
  const int64_t D = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t out_h = cfg_.out_hidden_size, in = patch_->cols();
  const int64_t S = total_patches(grids);
  const DType act = be_.act_dtype();
  for (auto [buf, elems] : {std::pair{&pix_act_, S * in},
                            {&x_, S * D},
                            {&xn_, S * D},
                            {&tmp_, S * D},
                            {&qkv_, S * 3 * D},
                            {&q_, S * D},
                            {&k_, S * D},
                            {&v_, S * D},
                            {&attn_, S * D},
                            {&mlp_, S * I},
                            {&m_norm_, S * D},
                            {&m_hidden_, S * D}}) {
    VLM_RETURN_IF_ERROR(grow(buf, elems, act));
  }
  VLM_RETURN_IF_ERROR(grow(&m_out_, (S / (m * m)) * out_h, DType::kF32));
  // Host tables, image after image: the interpolated positions (added to zeros) and the rotary
  // angles.
  h_pos_.assign(static_cast<size_t>(S * D), 0.f);
  h_cos_.clear();
  h_sin_.clear();
  int64_t row = 0;
  for (const GridThw& g : grids) {
    add_position_embedding(g, h_pos_.data() + row * D);
    rotary_tables(g, &h_cos_, &h_sin_);
    row += g.patches();
  }
  VLM_ASSIGN_OR_RETURN(pos_dev_, be_.stage(h_pos_.data(), h_pos_.size() * 4, DType::kF32, &pos_));
  VLM_ASSIGN_OR_RETURN(cos_dev_, be_.stage(h_cos_.data(), h_cos_.size() * 4, DType::kF32, &cos_));
  VLM_ASSIGN_OR_RETURN(sin_dev_, be_.stage(h_sin_.data(), h_sin_.size() * 4, DType::kF32, &sin_));
  return ok_status();
}

Status VisionEncoder::embed(ops::Buf input, int64_t r0, int64_t r1) {
  const int64_t D = cfg_.hidden_size, n = r1 - r0;
  const ops::Buf x = x_.at(r0 * D);
  VLM_RETURN_IF_ERROR(be_.linear(input.at(r0 * patch_->cols()), n, *patch_, x));
  VLM_RETURN_IF_ERROR(be_.add_bias(x, patch_b_, n, D));
  return be_.add(x, pos_dev_.at(r0 * D), {}, n, D);
}

VisionEncoder::Job::~Job() {
  enc_->release_host_scratch();
  enc_->job_open_ = false;
}

std::unique_ptr<VisionEncoder::Job> VisionEncoder::make_job(const std::vector<GridThw>& grids,
                                                            ops::Buf input) {
  const int64_t m2 = cfg_.spatial_merge_size * cfg_.spatial_merge_size;
  std::unique_ptr<Job> job(new Job(this));
  job_open_ = true;
  job->grids_ = grids;
  job->input_ = input;
  job->S_ = total_patches(grids);
  job->out_.resize(grids.size());
  for (size_t i = 0; i < grids.size(); ++i) {
    VisionOutput& o = job->out_[i];
    o.tokens = grids[i].patches() / m2;
    o.embeds.resize(static_cast<size_t>(o.tokens * cfg_.out_hidden_size));
    o.deepstack.assign(deepstack_.size(),
                       std::vector<float>(static_cast<size_t>(o.tokens * cfg_.out_hidden_size)));
  }
  using K = Job::Kind;
  job->plan_.push_back({K::kEmbed});
  for (int64_t b = 0; b < static_cast<int64_t>(blocks_.size()); ++b) {
    for (K k : {K::kQkv, K::kAttention, K::kProjection, K::kMlp}) job->plan_.push_back({k, b});
    // DeepStack taps: the hidden state after block b, through that tap's own merger.
    for (size_t tap = 0; tap < cfg_.deepstack_visual_indexes.size(); ++tap) {
      if (cfg_.deepstack_visual_indexes[tap] == b) {
        job->plan_.push_back({K::kMerger, static_cast<int64_t>(tap)});
      }
    }
  }
  job->plan_.push_back({K::kMerger, -1});
  return job;
}

Status VisionEncoder::finish(std::unique_ptr<Job> job, VisionOutput* out) {
  while (!job->done()) VLM_RETURN_IF_ERROR(advance(job.get(), 0));
  for (size_t i = 0; i < job->out_.size(); ++i) out[i] = std::move(job->out_[i]);
  return ok_status();
}

Result<ops::Buf> VisionEncoder::stage_pixels(const float* pixel_values, const GridThw& g) {
  const int64_t n = g.patches() * patch_->cols();
  VLM_ASSIGN_OR_RETURN(ops::Buf pix,
                       be_.stage(pixel_values, static_cast<size_t>(n) * 4, DType::kF32, &pix_));
  if (be_.act_dtype() == DType::kF32) return pix;
  VLM_RETURN_IF_ERROR(be_.convert(pix, n, pix_act_.buf()));
  return pix_act_.buf();
}

Result<std::unique_ptr<VisionEncoder::Job>> VisionEncoder::begin(const float* pixel_values,
                                                                 const GridThw& g) {
  VLM_RETURN_IF_ERROR(check_grid(g, cfg_.spatial_merge_size));
  if (job_open_) return internal_error("the vision encoder is already running an encode");
  const std::vector<GridThw> grids{g};
  VLM_RETURN_IF_ERROR(prepare(grids));
  VLM_ASSIGN_OR_RETURN(ops::Buf input, stage_pixels(pixel_values, g));
  return make_job(grids, input);
}

Status VisionEncoder::encode(const float* pixel_values, const GridThw& g, VisionOutput* out) {
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, begin(pixel_values, g));
  return finish(std::move(job), out);
}

Result<std::unique_ptr<VisionEncoder::Job>> VisionEncoder::begin_rgb(const RgbImage* images,
                                                                     int64_t n) {
  const int64_t P = cfg_.patch_size, T = cfg_.temporal_patch_size, m = cfg_.spatial_merge_size;
  if (n <= 0) return invalid_argument("begin_rgb: no images");
  if (job_open_) return internal_error("the vision encoder is already running an encode");
  std::vector<GridThw> grids;
  int64_t bytes = 0;
  for (int64_t i = 0; i < n; ++i) {
    VLM_RETURN_IF_ERROR(check_grid(images[i].grid, m));
    if (images[i].grid.t != 1) return invalid_argument("encode_rgb_batch: one frame per image");
    grids.push_back(images[i].grid);
    bytes += images[i].grid.h * P * images[i].grid.w * P * 3;
  }
  if (!be_.can_patchify()) {
    return internal_error(
        std::string("an image without pixel values reached the vision tower on ") +
        ops::device_name(be_.device()));
  }
  if (3 * T * P * P != patch_->cols())
    return invalid_argument("encode_rgb_batch: patch size mismatch");
  VLM_RETURN_IF_ERROR(prepare(grids));
  VLM_RETURN_IF_ERROR(grow(&rgb_, bytes, DType::kU8));
  VLM_RETURN_IF_ERROR(grow(&lut_, n * 3 * 256, DType::kF32));
  int64_t at = 0, row = 0;
  for (int64_t i = 0; i < n; ++i) {  // each image's bytes and table, then its patches in place
    const GridThw& g = images[i].grid;
    const int64_t b = g.h * P * g.w * P * 3;
    const ops::Buf rgb = rgb_.at(at), lut = lut_.at(i * 3 * 256);
    VLM_RETURN_IF_ERROR(be_.to_device(rgb, images[i].rgb, static_cast<size_t>(b)));
    VLM_RETURN_IF_ERROR(be_.to_device(lut, images[i].lut, 3 * 256 * 4));
    VLM_RETURN_IF_ERROR(
        be_.patchify(rgb, lut, g.h, g.w, P, m, T, pix_act_.at(row * patch_->cols())));
    at += b;
    row += g.patches();
  }
  return make_job(grids, pix_act_.buf());
}

Status VisionEncoder::encode_rgb_batch(const RgbImage* images, int64_t n, VisionOutput* out) {
  if (n <= 0) return ok_status();
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, begin_rgb(images, n));
  return finish(std::move(job), out);
}

Status VisionEncoder::embed_patches(const float* pixel_values, const GridThw& g, float* x) {
  VLM_RETURN_IF_ERROR(check_grid(g, cfg_.spatial_merge_size));
  VLM_RETURN_IF_ERROR(prepare({g}));
  const int64_t S = g.patches();
  VLM_ASSIGN_OR_RETURN(ops::Buf input, stage_pixels(pixel_values, g));
  VLM_RETURN_IF_ERROR(embed(input, 0, S));
  // To f32 on the host (through tmp_ where the activations are not f32).
  VLM_RETURN_IF_ERROR(grow(&m_out_, S * cfg_.hidden_size, DType::kF32));
  VLM_RETURN_IF_ERROR(be_.convert(x_.buf(), S * cfg_.hidden_size, m_out_.buf()));
  VLM_RETURN_IF_ERROR(be_.to_host(x, m_out_.buf(), static_cast<size_t>(S * cfg_.hidden_size) * 4));
  VLM_RETURN_IF_ERROR(be_.synchronize());
  release_host_scratch();
  return ok_status();
}

void VisionEncoder::space_of(const Job& job, int64_t* first, int64_t* rows) const {
  const Job::Stage& st = job.plan_[job.stage_];
  *first = 0;
  *rows = job.S_;
  if (st.kind == Job::Kind::kMerger) {
    *rows = job.S_ / (cfg_.spatial_merge_size * cfg_.spatial_merge_size);
  } else if (st.kind == Job::Kind::kAttention) {  // one space per temporal group of each image
    int64_t k = 0, at = 0;
    for (const GridThw& g : job.grids_) {
      for (int64_t t = 0; t < g.t; ++t, ++k, at += g.h * g.w) {
        if (k == job.space_) {
          *first = at;
          *rows = g.h * g.w;
          return;
        }
      }
    }
  }
}

int64_t VisionEncoder::next_unit_rows(const Job& job, int64_t rows) const {
  if (job.done()) return 0;
  int64_t first = 0, n = 0;
  space_of(job, &first, &n);
  const int64_t rest = n - job.row_, grain = be_.row_slice_grain();
  if (rows <= 0 || grain <= 0) return rest;
  const int64_t r = (rows + grain - 1) / grain * grain;
  return rest - r < grain ? rest : r;
}

double VisionEncoder::next_unit_flops(const Job& job, int64_t rows) const {
  if (job.done()) return 0;
  const double r = static_cast<double>(next_unit_rows(job, rows));
  const double D = static_cast<double>(cfg_.hidden_size),
               I = static_cast<double>(cfg_.intermediate_size);
  const double m2 = static_cast<double>(cfg_.spatial_merge_size * cfg_.spatial_merge_size);
  int64_t first = 0, n = 0;
  space_of(job, &first, &n);
  switch (job.plan_[job.stage_].kind) {
    case Job::Kind::kEmbed:
      return 2 * r * static_cast<double>(patch_->cols()) * D;
    case Job::Kind::kQkv:
      return 2 * r * D * 3 * D;
    case Job::Kind::kAttention:
      return 4 * r * static_cast<double>(n) * D;  // Q·Kᵀ and P·V
    case Job::Kind::kProjection:
      return 2 * r * D * D;
    case Job::Kind::kMlp:
      return 4 * r * D * I;
    case Job::Kind::kMerger:
      return 2 * r * (m2 * D) * (m2 * D + static_cast<double>(cfg_.out_hidden_size));
  }
  return 0;
}

Status VisionEncoder::run_merger(Job* job, const Merger& mw, bool postshuffle, int64_t tap,
                                 int64_t t0, int64_t t1) {
  const int64_t D = cfg_.hidden_size, m2 = cfg_.spatial_merge_size * cfg_.spatial_merge_size;
  const int64_t n = t1 - t0, wide = D * m2, out_h = cfg_.out_hidden_size;
  // Each run of merge² consecutive rows (one 2×2 block) is one token of width merge²·D; no block
  // straddles two images (each image's patches are a multiple of merge²).
  const ops::Buf norm = m_norm_.at(t0 * wide), hidden = m_hidden_.at(t0 * wide);
  const ops::Buf y = m_out_.at(t0 * out_h);
  if (postshuffle) {
    VLM_RETURN_IF_ERROR(
        be_.layer_norm(x_.at(t0 * wide), mw.norm_w, mw.norm_b, n, wide, kLayerNormEps, norm));
  } else {
    VLM_RETURN_IF_ERROR(
        be_.layer_norm(x_.at(t0 * wide), mw.norm_w, mw.norm_b, n * m2, D, kLayerNormEps, norm));
  }
  VLM_RETURN_IF_ERROR(be_.linear(norm, n, *mw.fc1, hidden));
  // Both mergers use nn.GELU() (exact erf); fc1's bias add is fused into it.
  VLM_RETURN_IF_ERROR(be_.bias_gelu(hidden, mw.fc1_b, n, wide, /*tanh=*/false));
  VLM_RETURN_IF_ERROR(be_.linear(hidden, n, *mw.fc2, y));
  VLM_RETURN_IF_ERROR(be_.add_bias(y, mw.fc2_b, n, out_h));
  int64_t first = 0;  // each image's tokens among [t0, t1) to its output
  for (VisionOutput& o : job->out_) {
    const int64_t b = std::max(first, t0), e = std::min(first + o.tokens, t1);
    if (b < e) {
      std::vector<float>& dst = tap < 0 ? o.embeds : o.deepstack[static_cast<size_t>(tap)];
      VLM_RETURN_IF_ERROR(be_.to_host(dst.data() + (b - first) * out_h, m_out_.at(b * out_h),
                                      static_cast<size_t>((e - b) * out_h) * 4));
    }
    first += o.tokens;
  }
  // The next merger writes m_out_ again: its copies must be done.
  return be_.synchronize();
}

// NOTE(vlm): every residual add runs fused into the LayerNorm after it (add_layer_norm:
// x += delta + bias, xn = LN(x) in one pass over x): the attention's into norm2, the MLP's into
// the next block's norm1 (the patch embedding's norm1 of block 0 into its stage). The bias adds
// of the linear layers ride along the same way. Every op but the attention works row by row, so
// a stage over rows [r0, r1) computes exactly those rows of what it computes over all of them.
Status VisionEncoder::advance(Job* job, int64_t rows) {
  if (job->done()) return ok_status();
  const int64_t D = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t nh = cfg_.num_heads, hd = D / nh, half = hd / 2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float eps = kLayerNormEps;
  int64_t first = 0, n = 0;
  space_of(*job, &first, &n);
  const int64_t r = next_unit_rows(*job, rows);
  const int64_t r0 = first + job->row_, r1 = r0 + r;
  const Job::Stage st = job->plan_[job->stage_];
  const size_t n_blocks = blocks_.size();
  switch (st.kind) {
    case Job::Kind::kEmbed:
      VLM_RETURN_IF_ERROR(embed(job->input_, r0, r1));
      if (n_blocks > 0) {
        VLM_RETURN_IF_ERROR(be_.layer_norm(x_.at(r0 * D), blocks_[0].norm1_w, blocks_[0].norm1_b, r,
                                           D, eps, xn_.at(r0 * D)));
      }
      break;
    case Job::Kind::kQkv: {
      const Block& B = blocks_[static_cast<size_t>(st.block)];
      VLM_RETURN_IF_ERROR(be_.linear(xn_.at(r0 * D), r, *B.qkv, qkv_.at(r0 * 3 * D)));
      VLM_RETURN_IF_ERROR(be_.split_qkv(qkv_.at(r0 * 3 * D), B.qkv_b, r, D, q_.at(r0 * D),
                                        k_.at(r0 * D), v_.at(r0 * D)));
      VLM_RETURN_IF_ERROR(
          be_.rope(q_.at(r0 * D), r, nh, hd, cos_dev_.at(r0 * half), sin_dev_.at(r0 * half)));
      VLM_RETURN_IF_ERROR(
          be_.rope(k_.at(r0 * D), r, nh, hd, cos_dev_.at(r0 * half), sin_dev_.at(r0 * half)));
      break;
    }
    case Job::Kind::kAttention: {  // one frame's queries [row_, row_ + r) over all its keys
      const int64_t off = first * D;
      if (r == n) {
        VLM_RETURN_IF_ERROR(be_.attention_full(q_.at(off), k_.at(off), v_.at(off), n, nh, hd, scale,
                                               attn_.at(off)));
      } else {
        VLM_RETURN_IF_ERROR(be_.attention_full_rows(q_.at(off), k_.at(off), v_.at(off), n,
                                                    job->row_, job->row_ + r, nh, hd, scale,
                                                    attn_.at(off)));
      }
      break;
    }
    case Job::Kind::kProjection: {
      const Block& B = blocks_[static_cast<size_t>(st.block)];
      VLM_RETURN_IF_ERROR(be_.linear(attn_.at(r0 * D), r, *B.proj, tmp_.at(r0 * D)));
      VLM_RETURN_IF_ERROR(be_.add_layer_norm(x_.at(r0 * D), tmp_.at(r0 * D), B.proj_b, B.norm2_w,
                                             B.norm2_b, r, D, eps, xn_.at(r0 * D)));
      break;
    }
    case Job::Kind::kMlp: {
      const size_t b = static_cast<size_t>(st.block);
      const Block& B = blocks_[b];
      VLM_RETURN_IF_ERROR(be_.linear(xn_.at(r0 * D), r, *B.fc1, mlp_.at(r0 * I)));
      VLM_RETURN_IF_ERROR(be_.bias_gelu(mlp_.at(r0 * I), B.fc1_b, r, I, /*tanh=*/true));
      VLM_RETURN_IF_ERROR(be_.linear(mlp_.at(r0 * I), r, *B.fc2, tmp_.at(r0 * D)));
      if (b + 1 < n_blocks) {
        const Block& N = blocks_[b + 1];
        VLM_RETURN_IF_ERROR(be_.add_layer_norm(x_.at(r0 * D), tmp_.at(r0 * D), B.fc2_b, N.norm1_w,
                                               N.norm1_b, r, D, eps, xn_.at(r0 * D)));
      } else {
        VLM_RETURN_IF_ERROR(be_.add(x_.at(r0 * D), tmp_.at(r0 * D), B.fc2_b, r, D));
      }
      break;
    }
    case Job::Kind::kMerger:
      VLM_RETURN_IF_ERROR(st.block < 0 ? run_merger(job, merger_, /*postshuffle=*/false, -1, r0, r1)
                                       : run_merger(job, deepstack_[static_cast<size_t>(st.block)],
                                                    /*postshuffle=*/true, st.block, r0, r1));
      break;
  }
  ++job->units_;
  job->row_ += r;
  if (job->row_ >= n) {  // the space is done: the next frame, or the next stage
    job->row_ = 0;
    int64_t spaces = 1;
    if (st.kind == Job::Kind::kAttention) {
      spaces = 0;
      for (const GridThw& g : job->grids_) spaces += g.t;
    }
    if (++job->space_ >= spaces) {
      job->space_ = 0;
      ++job->stage_;
    }
  }
  if (job->done()) release_host_scratch();
  return ok_status();
}

}  // namespace vlm
