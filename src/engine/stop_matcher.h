// Stop strings over streamed text: finds the first stop string and holds back any tail that could
// still become one, so streamed text never shows part of a stop string.
#pragma once

#include <string>
#include <vector>

namespace vlm {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends newly decoded text. Returns the text that is now safe to emit. Sets stopped() when a
  // stop string appeared; the text before it is emitted and nothing after.
  std::string push(const std::string& text);
  // Returns whatever was held back (call when generation ends without a stop string).
  std::string flush();
  bool stopped() const { return stopped_; }
  // Everything emitted so far.
  const std::string& emitted() const { return emitted_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // decoded but not yet emitted
  std::string emitted_;
  bool stopped_ = false;
};

}  // namespace vlm
