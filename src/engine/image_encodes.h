// The image encodes of requests waiting for admission, on the engine thread: one encode at a time
// (several images together on a device that patchifies), sliced over steps while other requests
// run. Which images go together and how much of a step an encode may take are the scheduler's
// (sched/step_budget.h); running the slices is the ModelRunner's. A finished encode goes into its
// images and the vision cache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/vision_cache.h"
#include "sched/scheduler.h"

namespace vlm {

class ImageEncodes {
 public:
  // `on_encode` (may be empty) gets each run's units and seconds. `draft` (may be null): a
  // speculative draft model's vision tower, which encodes each image too once the encode is done
  // (in one go, from the same pixels; EncodedImage::draft; if it fails, the images have none).
  ImageEncodes(VisionEncoder& vision, VisionCache& cache, ModelRunner& runner,
               std::function<void(int64_t, double)> on_encode, VisionEncoder* draft = nullptr);

  // This step's share of the encode in progress, or a new encode for the first of `waiting`
  // (requests not yet admitted, in order; null entries are skipped) with an image to encode.
  // `fail` ends a request whose encode failed, once each (the encode is dropped first); the
  // request may be gone when it returns.
  void run(std::span<EngineRequest* const> waiting, Scheduler& sched,
           const std::function<void(EngineRequest&, const Status&)>& fail);
  // Drops the encode in progress if it serves request `id` (cancelled, ended): its carried
  // activations go with it.
  void drop(int64_t id);

 private:
  // Starts an encode for the first images of `waiting` not yet encoded; false when there is none
  // (or it failed to start, and `fail` ended its request).
  bool start(std::span<EngineRequest* const> waiting,
             const std::function<void(EngineRequest&, const Status&)>& fail);

  // Ends every request of the encode in progress with `st`, each once.
  void fail_all(const Status& st, const std::function<void(EngineRequest&, const Status&)>& fail);

  VisionEncoder& vision_;
  VisionEncoder* draft_;
  VisionCache& cache_;
  ModelRunner& runner_;
  std::function<void(int64_t, double)> on_encode_;
  // Forgets the encode in progress (its job's carried activations go with it).
  void clear();

  // The encode in progress: per image, the request it belongs to and its candidate entry (its
  // patches: its share of the time); candidates_ may hold one more, the first left out.
  std::vector<EngineRequest*> requests_;
  std::vector<StagedImage*> images_;
  std::vector<StepBudget::EncodeCandidate> candidates_;
  std::unique_ptr<VisionEncoder::Job> job_;
};

}  // namespace vlm
