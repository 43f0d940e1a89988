#include "engine/image_encodes.h"

#include <algorithm>
#include <cstdio>

#include "core/clock.h"
#include "vlm/log.h"

namespace vlm {

ImageEncodes::ImageEncodes(VisionEncoder& vision, VisionCache& cache, ModelRunner& runner,
                           std::function<void(int64_t, double)> on_encode, VisionEncoder* draft)
    : vision_(vision),
      draft_(draft),
      cache_(cache),
      runner_(runner),
      on_encode_(std::move(on_encode)) {}

void ImageEncodes::clear() {
  requests_.clear();
  images_.clear();
  candidates_.clear();
  job_.reset();
}

void ImageEncodes::drop(int64_t id) {
  if (std::any_of(requests_.begin(), requests_.end(),
                  [id](const EngineRequest* r) { return r->id == id; })) {
    clear();
  }
}

bool ImageEncodes::start(std::span<EngineRequest* const> waiting,
                         const std::function<void(EngineRequest&, const Status&)>& fail) {
  // Every image not yet encoded (nor found in the cache meanwhile), in admission order; the
  // scheduler's rule says how many of the first go together.
  clear();
  const bool batch = vision_.takes_rgb();
  bool full = false;
  for (EngineRequest* r : waiting) {
    if (r == nullptr) continue;  // ended this step
    for (StagedImage& img : r->images) {
      if (!img.encoded) img.encoded = cache_.get(img.key);
      if (img.encoded) continue;
      const PreprocessedImage& p = img.pixels;
      const int64_t n = p.grid_t * p.grid_h * p.grid_w;
      candidates_.push_back({n, p.pixel_values.empty() && !p.resized_rgb.empty()});
      if (StepBudget::encode_batch_size(candidates_, batch) < candidates_.size()) {
        full = true;  // it does not join the batch: the batch is complete
        break;
      }
      requests_.push_back(r);
      images_.push_back(&img);
    }
    if (full) break;
  }
  const size_t n = images_.size();
  if (n == 0) return false;
  auto job = begin_encode(vision_, images_);
  if (!job.ok() && n > 1) {  // the first image alone says whose error it is
    requests_.resize(1);
    images_.resize(1);
    job = begin_encode(vision_, images_);
  }
  if (!job.ok()) {
    EngineRequest& r = *requests_[0];
    const StagedImage* first = images_[0];
    const auto k = std::count_if(static_cast<const StagedImage*>(r.images.data()), first,
                                 [&](const StagedImage& x) { return x.video == first->video; });
    drop(r.id);
    fail(r,
         job.status().with_context((first->video ? "video " : "image ") + std::to_string(k + 1)));
    return false;
  }
  job_ = std::move(job).value();
  return true;
}

void ImageEncodes::fail_all(const Status& st,
                            const std::function<void(EngineRequest&, const Status&)>& fail) {
  // Every request of the encode fails, each once (a request's images are adjacent).
  std::vector<EngineRequest*> failed = requests_;
  failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
  drop(failed[0]->id);
  for (EngineRequest* r : failed) fail(*r, st);
}

void ImageEncodes::run(std::span<EngineRequest* const> waiting, Scheduler& sched,
                       const std::function<void(EngineRequest&, const Status&)>& fail) {
  if (!job_ && !start(waiting, fail)) return;
  const StepBudget::EncodeShare share = sched.encode_share();
  if (!share.run) return;
  const auto t0 = Clock::now();
  const Result<int64_t> units = runner_.encode(*job_, share.budget_ms);
  const double ms = ms_since(t0);
  sched.record_encode(ms);
  if (units.ok() && on_encode_) on_encode_(*units, ms / 1000);
  int64_t patches = 0;
  for (size_t i = 0; i < images_.size(); ++i) patches += candidates_[i].patches;
  for (size_t i = 0; i < images_.size(); ++i) {  // each request's share of the time
    requests_[i]->encode_ms +=
        ms * static_cast<double>(candidates_[i].patches) / static_cast<double>(patches);
  }
  if (!units.ok()) {
    fail_all(units.status(), fail);
    return;
  }
  if (!job_->done()) return;
  std::unique_ptr<VisionEncoder::Job> draft;
  if (draft_ != nullptr) {  // the draft model's features, from the same pixels
    const auto d0 = Clock::now();
    Status st = ok_status();
    auto begun = begin_encode(*draft_, images_);
    if (begun.ok()) {
      draft = std::move(begun).value();
      while (st.ok() && !draft->done()) st = draft_->advance(draft.get(), 0);
    } else {
      st = begun.status();
    }
    const double dms = ms_since(d0);
    for (size_t i = 0; i < images_.size(); ++i) requests_[i]->encode_ms += dms / images_.size();
    if (!st.ok()) {  // the draft's loss, not the requests': the draft sees these images' pads
      log_printf(LogLevel::kWarn,
                 "the draft model's vision tower failed, its proposals go on "
                 "without these images: %s",
                 st.message().c_str());
      draft.reset();
    }
  }
  take_encoded(*job_, images_, draft.get());
  for (StagedImage* img : images_) cache_.put(img->key, img->encoded);
  clear();
}

}  // namespace vlm
