#include "engine/pixel_budget.h"

#include <algorithm>

namespace vlm {

void PixelBudget::Lease::release() {
  if (budget_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(budget_->mu_);
    budget_->used_ -= pixels_;
  }
  budget_->cv_.notify_all();
  budget_ = nullptr;
}

PixelBudget::Lease PixelBudget::acquire(int64_t pixels) {
  pixels = std::max<int64_t>(pixels, 0);
  std::unique_lock<std::mutex> lock(mu_);
  auto fits = [&] { return total_ <= 0 || used_ == 0 || used_ + pixels <= total_; };
  if (!fits()) {
    ++waits_;
    cv_.wait(lock, fits);
  }
  used_ += pixels;
  peak_ = std::max(peak_, used_);
  return Lease(this, pixels);
}

int64_t PixelBudget::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}
int64_t PixelBudget::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}
int64_t PixelBudget::waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_;
}

}  // namespace vlm
