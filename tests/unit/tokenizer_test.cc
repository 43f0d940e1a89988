// Tokenizer goldens: encodings and decodings produced by the Hugging Face Rust tokenizers library
// (tests/data/tokenizer/README.md), plus streaming, error and concurrency checks.
#include "vlm/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace vlm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kDataDir = std::string(VLM_TESTDATA_DIR) + "/tokenizer";

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  if (!f.good()) return json::array();
  return json::parse(f);
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = Tokenizer::load(kDataDir + "/tokenizer.json");
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) {
      load_error_ = new std::string(r.status().message());
      return;
    }
    std::printf("[ info ] tokenizer.json loaded in %.1f ms\n",
                std::chrono::duration<double, std::milli>(t1 - t0).count());
    tok_ = std::move(r).value().release();
    corpus_ = new json(read_json(kDataDir + "/corpus-a.json"));
    decode_ = new json(read_json(kDataDir + "/decode-a.json"));
  }
  // A tokenizer that failed to load fails every test with its message (none runs on a null).
  void SetUp() override {
    if (load_error_ != nullptr) GTEST_FAIL() << "tokenizer.json did not load: " << *load_error_;
  }
  static void TearDownTestSuite() {
    delete load_error_;
    delete tok_;
    delete corpus_;
    delete decode_;
  }
  static std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

  static Tokenizer* tok_;
  static std::string* load_error_;
  static json* corpus_;
  static json* decode_;
};
Tokenizer* TokenizerTest::tok_ = nullptr;
std::string* TokenizerTest::load_error_ = nullptr;
json* TokenizerTest::corpus_ = nullptr;
json* TokenizerTest::decode_ = nullptr;

// Unicode's punctuation categories (P*), as Python's unicodedata gives them: ASCII's $ + < = > ^
// ` | ~ are symbols (S*), CJK and full-width marks are punctuation, letters and digits are not.
TEST(Utf8, PunctuationIsUnicodesGeneralCategory) {
  for (const char32_t c : {U'.', U'!', U'"', U'#', U'_', U'}', U'\u3002', U'\uFF09', U'\u2026',
                           U'\u00BF', U'\u300C'}) {
    EXPECT_TRUE(tok::is_punctuation(c)) << static_cast<uint32_t>(c);
  }
  for (const char32_t c : {U'$', U'+', U'<', U'^', U'`', U'|', U'~', U'a', U'7', U' ', U'\u4E2D',
                           U'\u2044', U'\uFF04'}) {
    EXPECT_FALSE(tok::is_punctuation(c)) << static_cast<uint32_t>(c);
  }
  EXPECT_FALSE(tok::is_punctuation(0xFFFFFFFF));  // utf8_next's invalid marker
}

TEST_F(TokenizerTest, Basics) {
  EXPECT_EQ(tok_->vocab_size(), 151669);
  EXPECT_EQ(tok_->eos_token_id(), 151645);  // <|im_end|> from tokenizer_config.json
  EXPECT_EQ(tok_->pad_token_id(), 151643);  // <|endoftext|>
  EXPECT_EQ(tok_->token_to_id("<|image_pad|>"), 151655);
  EXPECT_EQ(tok_->token_to_id("<think>"), 151667);
  EXPECT_EQ(tok_->token_to_id("Ġworld"), 1879);
  EXPECT_FALSE(tok_->token_to_id("no such token").has_value());
  EXPECT_EQ(tok_->id_to_token(1879), "Ġworld");
  EXPECT_EQ(tok_->id_to_token(151644), "<|im_start|>");
  EXPECT_EQ(tok_->id_to_token(-1), "");
  EXPECT_EQ(tok_->token_bytes(1879), " world");
  EXPECT_EQ(tok_->token_bytes(151667), "<think>");
  EXPECT_EQ(tok_->token_bytes(151669), "");
  EXPECT_TRUE(tok_->is_special(151655));
  EXPECT_FALSE(tok_->is_special(151667));  // <think> is an added token but not special
  EXPECT_FALSE(tok_->is_special(1879));
  EXPECT_EQ(tok_->encode("一只猫在沙发上"), (std::vector<int32_t>{102292, 100472, 18493, 117733}));
  EXPECT_TRUE(tok_->encode("").empty());
}

TEST_F(TokenizerTest, LoadsFromDirectory) {
  auto r = Tokenizer::load(kDataDir);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->encode("Hello, world!"), (std::vector<int32_t>{9707, 11, 1879, 0}));
}

TEST_F(TokenizerTest, CorpusAEncodes) {
  int checked = 0, checked_split = 0;
  for (const json& rec : *corpus_) {
    const std::string text = rec["text"].get<std::string>();
    const std::string label = rec["category"].get<std::string>() + ": " + rec["text"].dump();
    EXPECT_EQ(tok_->encode(text), ids_of(rec["ids"])) << label;
    ++checked;
    if (rec.contains("ids_split_special")) {
      EXPECT_EQ(tok_->encode(text, /*split_special=*/true), ids_of(rec["ids_split_special"]))
          << label;
      ++checked_split;
    }
  }
  std::printf("[ info ] corpus-a: %d records checked, %d with split_special\n", checked,
              checked_split);
  ASSERT_EQ(checked, 330);
  ASSERT_EQ(checked_split, 16);
}

// Qwen3.5's tokenizer.json is Qwen3's format with another split regex (letter runs take
// combining marks, \p{M}): the same file with that regex encodes corpus-qwen35.json as the
// `tokenizers` library does (scripts/make_qwen35_reference.py, with transformers' own regex), and
// the strings it splits differently from Qwen3 come out differently here too.
TEST_F(TokenizerTest, Qwen35SplitRegexMatchesTransformers) {
  const json ref = read_json(kDataDir + "/corpus-qwen35.json");
  json data = read_json(kDataDir + "/tokenizer.json");
  json& split = data["pre_tokenizer"]["pretokenizers"][0];
  ASSERT_EQ(split["pattern"]["Regex"], ref["replaces"]);
  split["pattern"]["Regex"] = ref["regex"];
  const fs::path dir = fs::temp_directory_path() / ("vlm_qwen35_tok_" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "tokenizer.json", std::ios::binary);
    f << data.dump();
  }
  auto r = Tokenizer::load((dir / "tokenizer.json").string());
  fs::remove_all(dir);
  ASSERT_TRUE(r.ok()) << r.status().message();
  int checked = 0, differ = 0;
  for (const json& rec : ref["cases"]) {
    const std::string text = rec["text"].get<std::string>();
    const auto want = ids_of(rec["ids"]);
    EXPECT_EQ((*r)->encode(text), want) << rec["text"].dump();
    differ += tok_->encode(text) != want;
    ++checked;
  }
  EXPECT_EQ(checked, 336);
  EXPECT_EQ(differ, ref["differ_from_qwen3"].get<int>());
  EXPECT_GT(differ, 0);
}

TEST_F(TokenizerTest, DecodeA) {
  int checked = 0;
  for (const json& rec : *decode_) {
    const std::vector<int32_t> ids = ids_of(rec["ids"]);
    const std::string label = rec["category"].get<std::string>() + ": " + rec["ids"].dump();
    EXPECT_EQ(tok_->decode(ids, false), rec["text"].get<std::string>()) << label;
    const std::string skip = rec.contains("text_skip_special")
                                 ? rec["text_skip_special"].get<std::string>()
                                 : rec["text"].get<std::string>();
    if (rec.contains("text_skip_special")) {
      EXPECT_EQ(tok_->decode(ids, true), skip) << label;
    }
    ++checked;
  }
  ASSERT_EQ(checked, 210);
}

std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    // Every emitted chunk is complete text on its own.
    EXPECT_TRUE(tok::utf8_is_valid(piece));
    out += piece;
  }
  return out + detok.flush();
}

TEST_F(TokenizerTest, IncrementalMatchesDecode) {
  int checked = 0;
  for (const json* records : {corpus_, decode_}) {
    for (const json& rec : *records) {
      const std::vector<int32_t> ids = ids_of(rec["ids"]);
      for (bool skip : {false, true}) {
        EXPECT_EQ(stream(*tok_, ids, skip), tok_->decode(ids, skip)) << rec["ids"].dump();
      }
      ++checked;
    }
  }
  ASSERT_EQ(checked, 330 + 210);
}

TEST_F(TokenizerTest, IncrementalHoldsSplitEmoji) {
  // 🐱 is F0 9F 90 B1; feed it as four single-byte tokens.
  std::vector<int32_t> ids;
  for (unsigned char b : std::string("\xF0\x9F\x90\xB1")) {
    std::string ch;
    tok::utf8_append_codepoint(tok::byte_to_unicode(b), &ch);
    auto id = tok_->token_to_id(ch);
    ASSERT_TRUE(id.has_value());
    ids.push_back(*id);
  }
  IncrementalDetokenizer detok(*tok_);
  EXPECT_EQ(detok.push(ids[0]), "");
  EXPECT_EQ(detok.push(ids[1]), "");
  EXPECT_EQ(detok.push(ids[2]), "");
  EXPECT_EQ(detok.push(ids[3]), "\xF0\x9F\x90\xB1");
  EXPECT_EQ(detok.flush(), "");

  // Special tokens are dropped by default without disturbing the held bytes.
  IncrementalDetokenizer skip(*tok_);
  EXPECT_EQ(skip.push(ids[0]), "");
  EXPECT_EQ(skip.push(151645), "");
  EXPECT_EQ(skip.push(ids[1]), "");
  EXPECT_EQ(skip.push(ids[2]), "");
  EXPECT_EQ(skip.push(ids[3]), "\xF0\x9F\x90\xB1");

  // A held prefix that the next token does not continue becomes one U+FFFD.
  IncrementalDetokenizer broken(*tok_);
  EXPECT_EQ(broken.push(ids[0]), "");
  EXPECT_EQ(broken.push(ids[1]), "");
  EXPECT_EQ(broken.push(*tok_->token_to_id("A")),
            "\xEF\xBF\xBD"
            "A");
  // flush() turns an unfinished tail into U+FFFD.
  EXPECT_EQ(broken.push(ids[0]), "");
  EXPECT_EQ(broken.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(broken.flush(), "");
}

TEST(Utf8, LossyMatchesFromUtf8Lossy) {
  auto lossy = [](std::string_view s) {
    std::string out;
    tok::utf8_append_lossy(s, &out);
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("a\x80"
                  "b"),
            "a" + r + "b");
  EXPECT_EQ(lossy("\xE2\x82"
                  "A"),
            r + "A");                                   // truncated 3-byte: one U+FFFD
  EXPECT_EQ(lossy("\xF0\x80\x80"), r + r + r);          // F0 80 is not a valid start
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);          // surrogate
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(lossy("\xC0\xAF"), r + r);                  // overlong
  EXPECT_EQ(lossy("\xF0\x9F\x90"), r);                  // truncated at the end
}

TEST(Pretokenizer, WhitespaceRewrite) {
  auto r = tok::rewrite_whitespace_classes(R"(a\s+(?!\S)|[^\s\p{L}]|\\s|[]\s])");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->find("\\s"), r->find("\\\\s") + 1);  // only the escaped backslash form remains
  EXPECT_NE(r->find("[^\\t"), std::string::npos);
  EXPECT_FALSE(tok::rewrite_whitespace_classes(R"([\S])").ok());

  auto re = tok::SplitRegex::compile(R"(\s+|\S+)");
  ASSERT_TRUE(re.ok()) << re.status().message();
  std::vector<std::pair<size_t, size_t>> pieces;
  // U+0085 is White_Space (as in Oniguruma); U+FEFF and U+180E are not.
  const std::string text =
      "a\xC2\x85"
      "b\xEF\xBB\xBF"
      "c\xE1\xA0\x8E"
      "d";
  ASSERT_TRUE((*re)->split(text, &pieces));
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(text.substr(pieces[1].first, pieces[1].second - pieces[1].first), "\xC2\x85");
}

TEST(Nfc, FastPathMatchesUtf8proc) {
  auto check = [](const std::string& s) {
    std::string fast, full;
    ASSERT_TRUE(tok::nfc(s, &fast));
    ASSERT_TRUE(tok::nfc_full(s, &full));
    EXPECT_EQ(fast, full) << testing::PrintToString(s);
  };
  auto u = [](uint32_t cp) {
    std::string s;
    tok::utf8_append_codepoint(cp, &s);
    return s;
  };
  for (uint32_t cp = 0; cp < 0x300; ++cp) EXPECT_TRUE(tok::nfc_is_inert(cp)) << cp;
  EXPECT_TRUE(tok::nfc_is_inert(0x4E00));   // CJK
  EXPECT_TRUE(tok::nfc_is_inert(0xAC00));   // Hangul LV syllable
  EXPECT_TRUE(tok::nfc_is_inert(0x1F600));  // emoji
  EXPECT_FALSE(tok::nfc_is_inert(0x0301));  // combining mark
  EXPECT_FALSE(tok::nfc_is_inert(0x212B));  // ANGSTROM SIGN -> U+00C5
  EXPECT_FALSE(tok::nfc_is_inert(0x1161));  // Hangul V jamo composes with a preceding L
  EXPECT_FALSE(tok::nfc_is_inert(0x0F73));  // decomposes to two non-starters
  check("e\xCC\x81");
  check("caf" + u('e') + u(0x301) + " na" + u(0x131) + u(0x308) + "ve " + u(0x212B));
  check(u(0x1100) + u(0x1161) + u(0x11A8) + " " + u(0xAC00) + u(0x11A7) + u(0xAC00) + u(0x11A8));
  check(u(0x0CC6) + u(0x0CC2) + u(0x0CD5) + " " + u(0x0DD9) + u(0x0DCF) + u(0x0DCA));
  // Random strings over code points chosen to interact: starters, marks, jamo, singletons.
  const std::vector<uint32_t> pool = {
      'a',     'e',     'A',     ' ',     0x300,  0x301,  0x308,  0x323,  0x327,  0x338,
      0x345,   0x3B1,   0x3B9,   0x1100,  0x1161, 0x11A7, 0x11A8, 0xAC00, 0xAC01, 0x4E00,
      0x1F600, 0x0F71,  0x0F72,  0x0F73,  0x0CC6, 0x0CC2, 0x0CD5, 0x0DD9, 0x0DCF, 0x0DCA,
      0x212B,  0x2126,  0xE9,    0x1E63,  0x307,  0x3099, 0x304B, 0x309A, 0x0627, 0x0653,
      0x0654,  0x09C7,  0x09BE,  0x09D7,  0x0B47, 0x0B3E, 0x1025, 0x102E, 0x1B05, 0x1B35,
      0x110B1, 0x110BA, 0x11131, 0x11127, 0xFB1D, 0x5D9,  0x5B4,  0xF900, 0xFEFF};
  std::mt19937 rng(3);
  for (int t = 0; t < 20000; ++t) {
    std::string s;
    for (int k = 1 + rng() % 8; k > 0; --k) s += u(pool[rng() % pool.size()]);
    check(s);
  }
}

TEST(Bpe, ScanAndHeapAgree) {
  // A synthetic merge table over a 4-symbol alphabet; merged ids start at 4.
  std::mt19937 rng(7);
  tok::MergeMap merges;
  int32_t next_id = 4;
  for (int32_t rank = 0; rank < 60; ++rank) {
    std::uniform_int_distribution<int32_t> pick(0, next_id - 1);
    merges.insert(pick(rng), pick(rng), rank, next_id++);
  }
  for (int trial = 0; trial < 2000; ++trial) {
    std::uniform_int_distribution<int> len(0, 120), sym(0, 3);
    std::vector<int32_t> ids(len(rng));
    for (auto& x : ids) x = sym(rng);
    std::vector<int32_t> a = ids, b = ids;
    tok::bpe_merge_scan(merges, &a);
    tok::bpe_merge_heap(merges, &b);
    ASSERT_EQ(a, b) << "trial " << trial;
  }
  // Ties go to the leftmost pair: "aaa" -> "aa" "a".
  tok::MergeMap aa;
  aa.insert(0, 0, 0, 1);
  std::vector<int32_t> x = {0, 0, 0};
  tok::bpe_merge(aa, &x);
  EXPECT_EQ(x, (std::vector<int32_t>{1, 0}));
}

TEST_F(TokenizerTest, ConcurrentEncode) {
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        for (const json& rec : *corpus_) {
          if (tok_->encode(rec["text"].get<std::string>()) != ids_of(rec["ids"])) ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST_F(TokenizerTest, OddInputsDoNotCrash) {
  // Invalid UTF-8 is encoded as its lossy decoding; long uniform runs stay single pieces.
  EXPECT_EQ(tok_->encode("a\xFF"
                         "b"),
            tok_->encode("a\xEF\xBF\xBD"
                         "b"));
  EXPECT_EQ(tok_->decode(tok_->encode(std::string(100000, ' '))), std::string(100000, ' '));
  const std::string letters(200000, 'x');
  EXPECT_EQ(tok_->decode(tok_->encode(letters)), letters);
  const std::string punct(50000, '!');
  EXPECT_EQ(tok_->decode(tok_->encode(punct)), punct);
  std::vector<int32_t> bad = {-5, 9707, 1 << 30};
  EXPECT_EQ(tok_->decode(bad), "Hello");
}

TEST_F(TokenizerTest, EncodeThroughput) {
  std::string text;
  for (const json& rec : *corpus_) text += rec["text"].get<std::string>() + "\n";
  while (text.size() < (1u << 20)) text += text;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok_->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ info ] encode: %.2f MB in %.1f ms = %.1f MB/s, %.2f M tokens/s\n",
              text.size() / 1e6, s * 1e3, text.size() / 1e6 / s, ids.size() / 1e6 / s);
  EXPECT_GT(ids.size(), text.size() / 8);
}

// Error cases: each returns a non-ok Status whose message names the file.
class TokenizerErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("vlm_tokenizer_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  fs::path dir_;
};

TEST_F(TokenizerErrorTest, MissingFile) {
  const std::string path = (dir_ / "nope.json").string();
  auto r = Tokenizer::load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("nope.json"), std::string::npos) << r.status().message();
}

TEST_F(TokenizerErrorTest, InvalidJson) {
  const std::string path = write("broken.json", "{\"model\": {\"vocab\": ");
  auto r = Tokenizer::load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("broken.json"), std::string::npos) << r.status().message();
}

TEST_F(TokenizerErrorTest, MissingModel) {
  const std::string path = write("nomodel.json", R"({"version": "1.0", "added_tokens": []})");
  auto r = Tokenizer::load(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nomodel.json"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("model"), std::string::npos);
}

TEST_F(TokenizerErrorTest, BadMergesAndTypes) {
  const std::string pre =
      R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
  const std::string bad_merge =
      write("badmerge.json", R"({)" + pre + R"(, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1},
      "merges": ["a c"]}})");
  auto r = Tokenizer::load(bad_merge);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("badmerge.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("merges[0]"), std::string::npos) << r.status().message();

  const std::string bad_type = write("badtype.json", R"({"model": {"vocab": {"a": "x"}}})");
  r = Tokenizer::load(bad_type);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("badtype.json"), std::string::npos);

  const std::string wrong_field = write("wrongfield.json", R"({"model": {"type": 3}})");
  r = Tokenizer::load(wrong_field);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("wrongfield.json"), std::string::npos);

  // A minimal valid file loads, with merges in both spellings.
  const std::string good = write("tokenizer.json", R"({)" + pre + R"(, "model": {"type": "BPE",
      "vocab": {"a": 0, "b": 1, "ab": 2, "abb": 3}, "merges": ["a b", ["ab", "b"]]}})");
  r = Tokenizer::load(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->encode("abbab"), (std::vector<int32_t>{3, 2}));
  EXPECT_FALSE((*r)->eos_token_id().has_value());
  (void)good;

  // A second tokenizer on the same thread must not see the first one's cached pieces.
  const std::string other = write("other.json", R"({)" + pre + R"(, "model": {"type": "BPE",
      "vocab": {"a": 0, "b": 1, "ab": 2, "abb": 3}, "merges": ["a b"]}})");
  auto r2 = Tokenizer::load(other);
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*r2)->encode("abbab"), (std::vector<int32_t>{2, 1, 2}));
    EXPECT_EQ((*r)->encode("abbab"), (std::vector<int32_t>{3, 2}));
  }
}

}  // namespace
}  // namespace vlm
