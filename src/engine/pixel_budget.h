// A budget of decoded image pixels in flight across the threads that decode images (the server's
// workers): each image holds its width × height from the moment its header is read until it is
// preprocessed, and an image that does not fit waits for others to finish. Bounds what many
// large images decoding at once can take, which the per-image limits cannot.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace vlm {

class PixelBudget {
 public:
  // total <= 0: no limit (acquire never waits).
  explicit PixelBudget(int64_t total) : total_(total) {}

  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : budget_(o.budget_), pixels_(o.pixels_) { o.budget_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        release();
        budget_ = o.budget_;
        pixels_ = o.pixels_;
        o.budget_ = nullptr;
      }
      return *this;
    }
    ~Lease() { release(); }

   private:
    friend class PixelBudget;
    Lease(PixelBudget* b, int64_t n) : budget_(b), pixels_(n) {}
    void release();
    PixelBudget* budget_ = nullptr;
    int64_t pixels_ = 0;
  };

  // Blocks until `pixels` fit beside those in flight; an image larger than the whole budget
  // waits until nothing else is in flight, then goes alone.
  Lease acquire(int64_t pixels);

  int64_t total() const { return total_; }
  int64_t in_flight() const;
  int64_t peak() const;   // the most pixels in flight at once so far
  int64_t waits() const;  // images that had to wait

 private:
  const int64_t total_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t used_ = 0, peak_ = 0, waits_ = 0;
};

}  // namespace vlm
