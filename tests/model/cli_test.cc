// The `vlm` binary end to end: tokenize, detokenize, logits, run, and its errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/npy.h"
#include "test_util.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
const std::string kCli = VLM_CLI_PATH;
const std::string kFixtures = VLM_FIXTURES_DIR;
const std::string kTokenizerDir = std::string(VLM_SHARED_DIR) + "/data/tokenizer";

struct CliResult {
  int code = -1;
  std::string out, err;
};

// Runs `vlm ARGS` (ARGS already shell-quoted), capturing stdout and stderr.
CliResult vlm(const std::string& args) {
  test_util::TempDir tmp;
  const fs::path err = tmp.file("stderr");
  CliResult r;
  FILE* p = ::popen((kCli + " " + args + " 2>" + err.string()).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = test_util::read_file(err);
  return r;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(Cli, TokenizeAndDetokenize) {
  CliResult r = vlm("tokenize -m " + quote(kTokenizerDir) + " --text " + quote("Hello, world!"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[9707, 11, 1879, 0]\n");

  // Special-token text: matched by default, plain text with --split-special.
  r = vlm("tokenize -m " + quote(kTokenizerDir) + " --text " + quote("<|im_start|>user"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[151644, 872]\n");
  r = vlm("tokenize -m " + quote(kTokenizerDir) + " --split-special --text " + quote("<|im_start|>"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out, "[151644]\n");

  test_util::TempDir tmp;
  const std::string file = tmp.file("text.txt");
  std::ofstream(file) << "一只猫在沙发上";
  r = vlm("tokenize -m " + quote(kTokenizerDir) + " --file " + quote(file));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[102292, 100472, 18493, 117733]\n");

  r = vlm("detokenize -m " + quote(kTokenizerDir) + " --ids 9707,11,1879,0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello, world!\n");
  r = vlm("detokenize -m " + quote(kTokenizerDir) + " --skip-special --ids '[151644, 872]'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "user\n");
}

TEST(Cli, LogitsWritesTheReferenceLogits) {
  const std::string dir = kFixtures + "/text-f32-untied";
  auto ref = nlohmann::json::parse(test_util::read_file(dir + "/reference.json"));
  const auto& entry = ref["logits"][1];
  test_util::TempDir tmp;
  const std::string out = tmp.file("logits.npy");
  CliResult r = vlm("logits -m " + quote(dir) + " --ids " + join_ids(entry["ids"]) + " --out " +
                    quote(out));
  ASSERT_EQ(r.code, 0) << r.err;
  auto got = read_npy(out);
  auto want = read_npy(dir + "/" + entry["file"].get<std::string>());
  ASSERT_TRUE(got.ok() && want.ok());
  ASSERT_EQ(got->shape, want->shape);
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < got->f32.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want->f32[i]));
    max_diff = std::max(max_diff, std::fabs(got->f32[i] - want->f32[i]));
  }
  EXPECT_LE(max_diff, 1e-4f * max_ref);
}

TEST(Cli, QuantInt8LogitsAndBench) {
  // --quant int8 reaches the engine: logits move off the reference, but only by the INT8 noise
  // (quant_test measures ≤ 4.4e-2 · max|logit| at worst on these fixtures).
  const std::string dir = kFixtures + "/text-f32-untied";
  auto ref = nlohmann::json::parse(test_util::read_file(dir + "/reference.json"));
  const auto& entry = ref["logits"][2];
  test_util::TempDir tmp;
  const std::string out = tmp.file("logits.npy");
  CliResult r = vlm("logits -m " + quote(dir) + " --ids " + join_ids(entry["ids"]) + " --out " +
                    quote(out) + " --quant int8");
  ASSERT_EQ(r.code, 0) << r.err;
  auto got = read_npy(out);
  auto want = read_npy(dir + "/" + entry["file"].get<std::string>());
  ASSERT_TRUE(got.ok() && want.ok());
  ASSERT_EQ(got->shape, want->shape);
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < got->f32.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want->f32[i]));
    max_diff = std::max(max_diff, std::fabs(got->f32[i] - want->f32[i]));
  }
  EXPECT_GT(max_diff, 1e-3f * max_ref);
  EXPECT_LE(max_diff, 1e-1f * max_ref);

  r = vlm("bench -m " + quote(dir) + " -p 8 -n 4 -r 1 -t 2 --quant int8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(" int8, peak RSS"), std::string::npos) << r.out;
}

TEST(Cli, QuantInt4LogitsAndBench) {
  // --quant int4 reaches the engine: logits move off the reference by the INT4 noise (quant_test
  // measures ≤ 0.54 · max|logit| at worst on this fixture, 12× int8's on average).
  const std::string dir = kFixtures + "/text-f32-untied";
  auto ref = nlohmann::json::parse(test_util::read_file(dir + "/reference.json"));
  const auto& entry = ref["logits"][2];
  test_util::TempDir tmp;
  const std::string out = tmp.file("logits.npy");
  CliResult r = vlm("logits -m " + quote(dir) + " --ids " + join_ids(entry["ids"]) + " --out " +
                    quote(out) + " --quant int4");
  ASSERT_EQ(r.code, 0) << r.err;
  auto got = read_npy(out);
  auto want = read_npy(dir + "/" + entry["file"].get<std::string>());
  ASSERT_TRUE(got.ok() && want.ok());
  ASSERT_EQ(got->shape, want->shape);
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < got->f32.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want->f32[i]));
    max_diff = std::max(max_diff, std::fabs(got->f32[i] - want->f32[i]));
  }
  EXPECT_GT(max_diff, 5e-2f * max_ref);
  EXPECT_LE(max_diff, 8e-1f * max_ref);

  r = vlm("bench -m " + quote(dir) + " -p 8 -n 4 -r 1 -t 2 --quant int4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(" int4, peak RSS"), std::string::npos) << r.out;
  r = vlm("bench --help");
  EXPECT_NE(r.out.find("int4 (one scale per 32 inputs)"), std::string::npos) << r.out;
}

TEST(Cli, LogitsWithAnImageExpandThePadAndMatchTransformers) {
  const std::string dir = kFixtures + "/vision-f32";
  auto ref = nlohmann::json::parse(test_util::read_file(dir + "/reference.json"));
  for (const auto& c : ref["cases"]) {
    if (c["name"] != "tall") continue;
    const auto& im = ref["images"]["tall"];
    test_util::TempDir tmp;
    const std::string out = tmp.file("logits.npy");
    CliResult r = vlm("logits -m " + quote(dir) + " --ids " + join_ids(c["prompt_ids"]) + " --image " +
                      quote(dir + "/" + im["source"].get<std::string>()) + " --min-pixels " +
                      std::to_string(im["min_pixels"].get<int64_t>()) + " --max-pixels " +
                      std::to_string(im["max_pixels"].get<int64_t>()) + " --out " + quote(out));
    ASSERT_EQ(r.code, 0) << r.err;
    auto got = read_npy(out);
    auto want = read_npy(dir + "/" + c["logits"]["file"].get<std::string>());
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->shape, want->shape);  // one row per position of the EXPANDED prompt
    float max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < got->f32.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(want->f32[i]));
      max_diff = std::max(max_diff, std::fabs(got->f32[i] - want->f32[i]));
    }
    EXPECT_LE(max_diff, 1e-4f * max_ref);
    return;
  }
  FAIL() << "no 'tall' case in the fixture";
}

TEST(Cli, ErrorsAreOneLineAndNonZero) {
  const std::string dir = kFixtures + "/text-f32-untied";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"logits -m /nonexistent/dir --ids 1 --out /tmp/x.npy", "/nonexistent/dir"},
      {"logits -m " + quote(dir) + " --ids 1,x --out /tmp/x.npy", "'x' is not a token id"},
      {"logits -m " + quote(dir) + " --ids 5000 --out /tmp/x.npy", "outside the vocabulary"},
      {"logits -m " + quote(dir) + " --ids 1 --out /nonexistent/dir/x.npy", "/nonexistent/dir/x.npy"},
      {"run -m " + quote(dir) + " -p hi", "tokenizer.json"},
      {"tokenize -m /nonexistent/tok --text hi", "/nonexistent/tok"},
      {"tokenize -m " + quote(kTokenizerDir), "--text or --file"},
      {"detokenize -m " + quote(kTokenizerDir) + " --ids 99999999", "outside the vocabulary"},
      {"frobnicate", "frobnicate"},
      {"logits -m " + quote(dir) + " --ids 1 --out /tmp/x.npy --quant int3",
       "unknown quantization 'int3'"},
      {"bench -m " + quote(dir) + " --quant fp8", "unknown quantization 'fp8'"},
      {"logits -m " + quote(kFixtures + "/vision-f32") + " --ids 10,1002,1000,1003 --image /nonexistent/x.png --out /tmp/x.npy",
       "/nonexistent/x.png"},
      {"logits -m " + quote(kFixtures + "/vision-f32") + " --ids 10,11 --image " +
           quote(kFixtures + "/vision-f32/synthetic_tiny.png") + " --out /tmp/x.npy",
       "0 image placeholders"},
  };
  for (const auto& c : cases) {
    CliResult r = vlm(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_EQ(r.err.rfind("vlm: error: ", 0), 0u) << c.args << " → " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << " → " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << " → " << r.err;
  }
}

// The full-vocabulary tiny checkpoint with the real tokenizer beside it, as a user's directory.
class CliRun : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string src = kFixtures + "/tiny-fullvocab-bf16";
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "reference.json"}) {
      fs::create_symlink(fs::absolute(src + "/" + f), dir_ / f);
    }
    fs::create_symlink(fs::absolute(kTokenizerDir + "/tokenizer.json"), dir_ / "tokenizer.json");
  }
  test_util::TempDir tmp_;
  const fs::path& dir_ = tmp_.path();
};

TEST_F(CliRun, GreedyReplyEqualsTransformersContinuation) {
  auto ref = nlohmann::json::parse(test_util::read_file(dir_ / "reference.json"));
  const auto& g = ref["greedy"][0];
  auto prompt_ids = g["prompt_ids"].get<std::vector<int32_t>>();
  // vlm computes in f32: compare with transformers' f32 run of the same bf16 weights.
  auto want_ids = g["output_ids_f32ref"].get<std::vector<int32_t>>();
  auto tok = Tokenizer::load(kTokenizerDir);
  ASSERT_TRUE(tok.ok());
  // The prompt as text; our tokenizer must give back the very ids transformers was fed.
  const std::string prompt = (*tok)->decode(prompt_ids);
  ASSERT_EQ((*tok)->encode(prompt), prompt_ids);
  CliResult r = vlm("run -m " + quote(dir_.string()) + " --raw --greedy --ignore-eos -n " +
              std::to_string(want_ids.size()) + " -p " + quote(prompt));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, (*tok)->decode(want_ids, /*skip_special=*/true) + "\n");
  // One summary line on stderr with the figures a user looks for.
  for (const char* s : {"prompt ", "prefill ", "tok/s", "generated ", "decode ", "peak RSS "}) {
    EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
  }
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST_F(CliRun, ImageQuestionReportsVisionWork) {
  const std::string cat = std::string(VLM_SHARED_DIR) + "/data/images/cat_chelsea.png";
  CliResult r = vlm("run -m " + quote(dir_.string()) + " --image " + quote(cat) +
                    " -p 'What is this?' -n 4 --greedy");
  ASSERT_EQ(r.code, 0) << r.err;
  // 451×300 → 448×288 at the default budget: 28 × 18 patches → 126 tokens.
  EXPECT_NE(r.err.find("images 1: 126 vision tokens"), std::string::npos) << r.err;
  for (const char* s : {"decode ", "preprocess ", "encode "}) EXPECT_NE(r.err.find(s), std::string::npos);
  // The rendered chat is 15 ids, one of them the single image pad; expanded: 14 + 126 = 140.
  EXPECT_NE(r.err.find("prompt 140 tokens"), std::string::npos) << r.err;
}

TEST_F(CliRun, ChatTemplateStopStringsAndSeeds) {
  // Default mode renders the chat template: the prompt count includes its tokens.
  CliResult r = vlm("run -m " + quote(dir_.string()) + " -p hi -n 4 --greedy");
  ASSERT_EQ(r.code, 0) << r.err;
  // <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n = 9 tokens
  EXPECT_NE(r.err.find("prompt 9 tokens"), std::string::npos) << r.err;

  const std::string base = "run -m " + quote(dir_.string()) + " -p hello -n 12 --ignore-eos "
                           "--temperature 1.0 --top-k 0 ";
  CliResult a = vlm(base + "--seed 5"), b = vlm(base + "--seed 5"), c = vlm(base + "--seed 6");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);

  // A stop string taken from the middle of the greedy reply cuts the reply just before it.
  CliResult full = vlm("run -m " + quote(dir_.string()) + " -p hello -n 24 --greedy --ignore-eos");
  ASSERT_EQ(full.code, 0) << full.err;
  const std::string reply = full.out.substr(0, full.out.size() - 1);
  ASSERT_GE(reply.size(), 8u);
  const std::string stop = reply.substr(reply.size() / 2, 3);
  const size_t at = reply.find(stop);
  CliResult stopped = vlm("run -m " + quote(dir_.string()) + " -p hello -n 24 --greedy --ignore-eos --stop " +
                    quote(stop));
  ASSERT_EQ(stopped.code, 0) << stopped.err;
  EXPECT_EQ(stopped.out, reply.substr(0, at) + "\n");
}

}  // namespace
}  // namespace vlm
