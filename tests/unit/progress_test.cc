// vlm::ProgressStep: one line per step when stderr is not a terminal (text or JSON), nothing at
// --quiet's level or for a step that failed; on a pseudo-terminal the line redrawn in place
// (throttled, one row wide), vlm::log's lines above it, the last frame replaced by the plain line.
#include "vlm/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "vlm/log.h"

namespace vlm {
namespace {

// Restores the log's level and format after each test.
class Progress : public ::testing::Test {
 protected:
  void TearDown() override {
    set_log_level(LogLevel::kInfo);
    set_log_format(LogFormat::kText);
  }
};

// stderr as a pipe would see it (gtest captures fd 2 into a file).
template <typename F>
std::string captured(F&& f) {
  ::testing::internal::CaptureStderr();
  f();
  return ::testing::internal::GetCapturedStderr();
}

// stderr as a terminal `cols` wide would see it: a pseudo-terminal (no output post-processing:
// the bytes as written) in place of fd 2 while f runs, then what it was sent.
template <typename F>
std::string on_terminal(F&& f, int cols = 200, const char* term = "xterm") {
  int master = -1, slave = -1;
  winsize ws{};
  ws.ws_col = static_cast<unsigned short>(cols);
  ws.ws_row = 24;
  EXPECT_EQ(::openpty(&master, &slave, nullptr, nullptr, &ws), 0);
  termios t{};
  ::tcgetattr(slave, &t);
  t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
  ::tcsetattr(slave, TCSANOW, &t);
  const char* old_term = std::getenv("TERM");
  const std::string saved_term = old_term ? old_term : "";
  ::setenv("TERM", term, 1);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(slave, STDERR_FILENO);
  f();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(slave);
  if (old_term) {
    ::setenv("TERM", saved_term.c_str(), 1);
  } else {
    ::unsetenv("TERM");
  }
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(master);
  return out;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST_F(Progress, OneLineWhenTheStepEnds) {
  const std::string out = captured([] {
    ProgressStep step("quantizing the text decoder to int8", 28, "layers");
    for (int i = 0; i < 28; ++i) step.advance();
    step.finish();
    step.finish();  // once
    ProgressStep one("measuring the kernels", 1, "runs");
    one.advance();
    one.finish();
  });
  EXPECT_TRUE(
      std::regex_match(out, std::regex("vlm: quantizing the text decoder to int8: 28 layers "
                                       "in [0-9]+\\.[0-9] s\n"
                                       "vlm: measuring the kernels: 1 run in [0-9.]+ s\n")))
      << out;
}

TEST_F(Progress, BytesAreSaidInBinaryUnitsWithTheRate) {
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(3 << 20), "3.0 MiB");
  EXPECT_EQ(human_bytes(int64_t{3} << 30 | int64_t{1} << 29), "3.5 GiB");
  const std::string out = captured([] {
    ProgressStep step("reading the weights", int64_t{3} << 20, "bytes");
    step.advance(int64_t{1} << 20);
    step.advance(int64_t{2} << 20);
    step.finish();
  });
  EXPECT_TRUE(
      std::regex_search(out, std::regex("^vlm: reading the weights: 3\\.0 MiB in [0-9.]+ s")))
      << out;
}

TEST_F(Progress, JsonObjectWithTheCounts) {
  set_log_format(LogFormat::kJson);
  const std::string out = captured([] {
    ProgressStep step("loading the GGUF vision tower", 24, "blocks");
    step.advance(24);
    step.finish();
  });
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["msg"], "loading the GGUF vision tower");
  EXPECT_EQ(j["done"], 24);
  EXPECT_EQ(j["total"], 24);
  EXPECT_EQ(j["unit"], "blocks");
  EXPECT_GE(j["seconds"].get<double>(), 0.0);
}

TEST_F(Progress, QuietAndFailedStepsSayNothing) {
  set_log_level(LogLevel::kWarn);
  EXPECT_EQ(captured([] {
              ProgressStep step("reading the weights", 10, "bytes");
              step.advance(10);
              step.finish();
            }),
            "");
  EXPECT_EQ(on_terminal([] {
              ProgressStep step("reading the weights", 10, "bytes");
              step.advance(10);
              step.finish();
            }),
            "");
  set_log_level(LogLevel::kInfo);
  EXPECT_EQ(captured([] {
              ProgressStep step("quantizing", 3, "layers");
              step.advance();
            }),
            "");
}

TEST_F(Progress, RedrawnInPlaceOnATerminal) {
  const std::string out = on_terminal([] {
    ProgressStep step("quantizing the text decoder to int4", 4, "layers");
    step.advance();
    log(LogLevel::kWarn, "a note while the step runs");
    for (int i = 0; i < 1000; ++i) step.advance(0);  // throttled: not a thousand frames
    step.advance(3);
    step.finish();
  });
  // The first frame at once, the warning above the line (which is drawn again under it), the
  // last frame replaced by the plain line.
  const std::string first =
      "\r\x1b[Kvlm: quantizing the text decoder to int4 [                    ] 0/4 layers, 0.0 s";
  ASSERT_EQ(out.rfind(first, 0), 0u) << out;
  // (The frame drawn last: 0/4, or 1/4 on a machine slow enough to redraw before the note.)
  EXPECT_TRUE(std::regex_search(out, std::regex("\r\x1b\\[Kvlm: warning: a note while the step "
                                                "runs\nvlm: quantizing the text decoder to int4 "
                                                "\\[[# ]{20}\\] [01]/4 layers, [0-9.]+ s")))
      << out;
  EXPECT_LT(count(out, "\r\x1b[K"), 10) << out;
  EXPECT_TRUE(std::regex_search(
      out,
      std::regex("\r\x1b\\[Kvlm: quantizing the text decoder to int4: 4 layers in [0-9.]+ s\n$")))
      << out;
}

TEST_F(Progress, AStepWithinAStepGivesTheLineBack) {
  const std::string out = on_terminal([] {
    ProgressStep outer("outer", 2, "layers");
    {
      ProgressStep inner("inner", 1, "runs");
      inner.advance();
      inner.finish();
    }
    outer.advance(2);
    outer.finish();
    outer.advance();  // after the end: nothing drawn again
    log(LogLevel::kInfo, "after");
  });
  // The inner line ends in the outer's place, the outer one is drawn again below it, and nothing
  // of either is left under a later line.
  EXPECT_TRUE(std::regex_search(out, std::regex("\r\x1b\\[Kvlm: inner: 1 run in [0-9.]+ s\nvlm: "
                                                "outer \\[ {20}\\] 0/2 layers")))
      << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("\r\x1b\\[Kvlm: outer: 2 layers in [0-9.]+ s\nvlm: after\n$")))
      << out;
}

TEST_F(Progress, ATerminalLineStaysOneRow) {
  const std::string out = on_terminal(
      [] {
        ProgressStep step("reading the weights of a model with a rather long name", 1 << 30,
                          "bytes");
        step.finish();
      },
      /*cols=*/40);
  const std::string first = out.substr(0, out.find('\r', 1));
  EXPECT_EQ(first, "\r\x1b[Kvlm: reading the weights of a model wit") << out;  // 39 columns
}

TEST_F(Progress, AFailedStepTakesItsLineBack) {
  const std::string out = on_terminal([] {
    {
      ProgressStep step("quantizing", 3, "layers");
      step.advance();
    }
    log(LogLevel::kError, "quantizing: no");
  });
  // The frame, then the line erased, then the error alone on it.
  EXPECT_TRUE(std::regex_match(out, std::regex("\r\x1b\\[Kvlm: quantizing \\[ +\\] 0/3 layers, "
                                               "0\\.0 s\r\x1b\\[Kvlm: error: quantizing: no\n")))
      << out;
}

TEST_F(Progress, ADumbTerminalOrJsonGetsLines) {
  const std::string dumb = on_terminal(
      [] {
        ProgressStep step("reading", 2, "layers");
        step.advance(2);
        step.finish();
      },
      80, "dumb");
  EXPECT_EQ(dumb.find('\x1b'), std::string::npos) << dumb;
  EXPECT_EQ(dumb.rfind("vlm: reading: 2 layers in ", 0), 0u) << dumb;
  set_log_format(LogFormat::kJson);
  const std::string json = on_terminal([] {
    ProgressStep step("reading", 2, "layers");
    step.advance(2);
    step.finish();
  });
  EXPECT_EQ(nlohmann::json::parse(json)["done"], 2) << json;
}

}  // namespace
}  // namespace vlm
