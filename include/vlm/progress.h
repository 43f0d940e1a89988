// vlm public API: the progress of a long step (reading the weights, quantizing them, measuring
// the kernels), said on stderr with vlm::log's level and format.
//
// On a terminal (stderr a tty whose TERM is not "dumb", text format, level info or more) one
// line is redrawn in place as the step goes:
//   vlm: quantizing the text decoder to int4 [##########          ] 14/28 layers, 3.1 s
// and left, when the step ends, as the same plain line a pipe gets. Elsewhere the step says one
// line when it ends:
//   vlm: quantizing the text decoder to int4: 28 layers in 7.9 s
// (with --log-format json one object: "msg" the step, then "done", "total", "unit", "seconds").
// Nothing at level warn or error (--quiet). A step that fails (destroyed before finish()) takes
// its line back and says nothing: the error that follows says why. Lines vlm::log writes while a
// step is drawn go above it.
// Steps may nest (a step within a step): the inner one's line is drawn, and the outer one's
// again when it ends.
// Thread-safety: advance() from any thread, but none still running when finish() or the
// destructor runs; the rest from the thread that made the step.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace vlm {

// "512 B", "3.0 MiB", "1.2 GiB": binary units, one decimal.
std::string human_bytes(int64_t n);

class ProgressStep {
 public:
  // `what`: the step, as "reading the weights"; `total`: how many units it has (the bar's end);
  // `unit`: what they are, plural ("layers", "kernels"), or "bytes" (said as human_bytes, with the
  // rate).
  ProgressStep(std::string what, int64_t total, std::string unit);
  ~ProgressStep();
  ProgressStep(const ProgressStep&) = delete;
  ProgressStep& operator=(const ProgressStep&) = delete;

  // `n` more units done (a terminal's line redrawn at most ten times a second).
  void advance(int64_t n = 1);
  // The step has ended: its line, once.
  void finish();

  int64_t done() const { return done_.load(); }

 private:
  std::string frame(bool final) const;
  void draw(bool force);

  std::string what_;
  std::string unit_;
  int64_t total_;
  std::atomic<int64_t> done_{0};
  std::chrono::steady_clock::time_point t0_;
  std::atomic<int64_t> last_draw_ns_{0};
  bool live_ = false;  // drawn in place (a terminal)
  bool quiet_ = false;
  std::atomic<bool> finished_{false};
};

}  // namespace vlm
