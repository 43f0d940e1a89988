// The hub layer without a network: model names, the environment, which files are chosen, the
// content hashes, and the cache's layout (refs, tree listings, snapshot links, ls, rm) on caches
// built here. tests/hub/hub_test.py drives the downloads against a local mock of the hub.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "hub/hub_internal.h"

namespace vlm::hub {
namespace {

std::vector<std::string> files_of(const Result<Selection>& s) {
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? s->files : std::vector<std::string>{};
}

TEST(HubNames, ParsesNameRevisionAndQuant) {
  auto n = parse_model_name("Qwen/Qwen3-VL-2B-Instruct");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->repo_id, "Qwen/Qwen3-VL-2B-Instruct");
  EXPECT_EQ(n->revision, "main");
  EXPECT_FALSE(n->revision_given);
  EXPECT_EQ(n->quant, "");
  n = parse_model_name("unsloth/Qwen3-VL-8B-Instruct-GGUF@v1.0:UD-Q4_K_XL");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->repo_id, "unsloth/Qwen3-VL-8B-Instruct-GGUF");
  EXPECT_EQ(n->revision, "v1.0");
  EXPECT_TRUE(n->revision_given);
  EXPECT_EQ(n->quant, "UD-Q4_K_XL");
  EXPECT_EQ(n->str(), "unsloth/Qwen3-VL-8B-Instruct-GGUF@v1.0:UD-Q4_K_XL");
  n = parse_model_name("a/b@refs/pr/1");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->revision, "refs/pr/1");
}

TEST(HubNames, RefusesMalformedNames) {
  for (const char* bad :
       {"Qwen", "/abs/path", "a/b/c", "a//b", "-a/b", "a/b.", "a--x/b", "a/b@", "a/b:", "a/b@x y",
        "a/b:Q4 K", "a/b@../x", "", "a/", "a/b@.x", "a/b@x/.y", "a/b@x//y"}) {
    auto n = parse_model_name(bad);
    EXPECT_FALSE(n.ok()) << bad;
    if (!n.ok()) EXPECT_NE(n.status().message().find("ORG/NAME"), std::string::npos);
  }
}

TEST(HubNames, AnExistingPathIsNoName) {
  char dir[] = "/tmp/vlm_hub_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string cwd = fs::current_path();
  fs::current_path(dir);
  fs::create_directories("org/model");
  EXPECT_FALSE(is_model_name("org/model"));  // the folder wins
  EXPECT_TRUE(is_model_name("org/other"));
  EXPECT_FALSE(is_model_name("./org/other"));
  EXPECT_FALSE(is_model_name("org"));
  fs::create_symlink("nowhere", "org/dangling");  // a dangling link is still a path
  EXPECT_FALSE(is_model_name("org/dangling"));
  fs::current_path(cwd);
  fs::remove_all(dir);
}

// Sets environment variables for one test, restoring them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : {"HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "HOME",
                             "HF_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "HUGGINGFACE_HUB_CACHE",
                             "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_OFFLINE"}) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
    for (const auto& [k, v] : vars) setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(HubEnv, CacheFolderAsHuggingfaceHubFindsIt) {
  {
    ScopedEnv e({{"HOME", "/h"}});
    const HubOptions o = options_from_env();
    EXPECT_EQ(o.cache_dir, "/h/.cache/huggingface/hub");
    EXPECT_EQ(o.endpoint, "https://huggingface.co");
    EXPECT_FALSE(o.offline);
    EXPECT_EQ(o.token, "");
  }
  {
    ScopedEnv e({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}});
    EXPECT_EQ(options_from_env().cache_dir, "/x/huggingface/hub");
  }
  {
    ScopedEnv e({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}, {"HF_HOME", "/hf"}});
    EXPECT_EQ(options_from_env().cache_dir, "/hf/hub");
  }
  {
    ScopedEnv e({{"HF_HOME", "/hf"}, {"HF_HUB_CACHE", "/c"}, {"HF_ENDPOINT", "http://m:1//"}});
    const HubOptions o = options_from_env();
    EXPECT_EQ(o.cache_dir, "/c");
    EXPECT_EQ(o.endpoint, "http://m:1");
  }
  {
    ScopedEnv e({{"HF_HOME", "/hf"}, {"HUGGINGFACE_HUB_CACHE", "/old"}});
    EXPECT_EQ(options_from_env().cache_dir, "/old");
  }
  {
    ScopedEnv e({{"TRANSFORMERS_OFFLINE", "1"}});
    EXPECT_TRUE(options_from_env().offline);
  }
  for (const char* on : {"1", "ON", "yes", "True"}) {
    ScopedEnv e({{"HF_HUB_OFFLINE", on}});
    EXPECT_TRUE(options_from_env().offline) << on;
  }
  for (const char* off : {"0", "", "no", "false"}) {
    ScopedEnv e({{"HF_HUB_OFFLINE", off}});
    EXPECT_FALSE(options_from_env().offline) << off;
  }
}

TEST(HubEnv, TokenFromFlagThenEnvironmentThenFiles) {
  char dir[] = "/tmp/vlm_hub_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string home = dir;
  std::ofstream(home + "/token") << "hf_from_home_file\n";
  std::ofstream(home + "/other") << "  hf_from_token_path \n";
  {
    ScopedEnv e({{"HF_HOME", home.c_str()}});
    EXPECT_EQ(options_from_env().token, "hf_from_home_file");
    EXPECT_EQ(options_from_env(" hf_flag ").token, "hf_flag");
  }
  {
    ScopedEnv e({{"HF_HOME", home.c_str()}, {"HF_TOKEN_PATH", (home + "/other").c_str()}});
    EXPECT_EQ(options_from_env().token, "hf_from_token_path");
  }
  {
    ScopedEnv e({{"HF_HOME", home.c_str()}, {"HUGGING_FACE_HUB_TOKEN", "hf_old_env"}});
    EXPECT_EQ(options_from_env().token, "hf_old_env");
  }
  {
    ScopedEnv e({{"HF_HOME", home.c_str()},
                 {"HF_TOKEN", "hf_env"},
                 {"HUGGING_FACE_HUB_TOKEN", "hf_old_env"}});
    EXPECT_EQ(options_from_env().token, "hf_env");
    EXPECT_EQ(options_from_env("hf_flag").token, "hf_flag");
  }
  fs::remove_all(home);
}

TEST(HubSelect, SafetensorsCheckpointTakesItsTopLevelFilesButOtherWeights) {
  const std::vector<std::string> repo = {".gitattributes",
                                         "LICENSE",
                                         "README.md",
                                         "chat_template.jinja",
                                         "config.json",
                                         "generation_config.json",
                                         "merges.txt",
                                         "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors",
                                         "model.safetensors.index.json",
                                         "pytorch_model.bin",
                                         "tf_model.h5",
                                         "original/consolidated.pth",
                                         "onnx/config.json",
                                         "model-Q8_0.gguf",
                                         "tokenizer.json",
                                         "tokenizer_config.json",
                                         "vocab.json"};
  const auto files = files_of(select_files(repo, "", "o/n"));
  const std::vector<std::string> want = {".gitattributes",
                                         "LICENSE",
                                         "README.md",
                                         "chat_template.jinja",
                                         "config.json",
                                         "generation_config.json",
                                         "merges.txt",
                                         "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors",
                                         "model.safetensors.index.json",
                                         "tokenizer.json",
                                         "tokenizer_config.json",
                                         "vocab.json"};
  EXPECT_EQ(files, want);
  auto s = select_files(repo, "", "o/n");
  EXPECT_EQ(s->model, "");
  EXPECT_EQ(s->mmproj, "");
  // The tokenizer alone (`vlm tokenize`): the same but the shards.
  auto no_weights = files_of(select_files(repo, "", "o/n", /*weights=*/false));
  std::vector<std::string> want_no_weights;
  for (const auto& f : want) {
    if (f.find(".safetensors") == std::string::npos || f.find(".json") != std::string::npos) {
      want_no_weights.push_back(f);
    }
  }
  EXPECT_EQ(no_weights, want_no_weights);
  EXPECT_EQ(files_of(select_files({"m-Q8_0.gguf"}, "", "o/n", false)),
            std::vector<std::string>{"m-Q8_0.gguf"});
}

// An embedding model in sentence-transformers' layout: its modules' JSON configurations (how it
// pools) come along; other subfolders still do not.
TEST(HubSelect, SentenceTransformersModuleConfigsComeAlong) {
  const std::vector<std::string> repo = {
      "config.json",           "model.safetensors",
      "modules.json",          "config_sentence_transformers.json",
      "1_Pooling/config.json", "1_Pooling/README.md",
      "12_Dense/config.json",  "1_Pooling/sub/config.json",
      "onnx/config.json",      "x_Pooling/config.json",
      "_Pooling/config.json"};
  const auto files = files_of(select_files(repo, "", "o/n"));
  const std::vector<std::string> want = {
      "config.json",           "model.safetensors",
      "modules.json",          "config_sentence_transformers.json",
      "1_Pooling/config.json", "12_Dense/config.json"};
  EXPECT_EQ(files, want);
}

TEST(HubSelect, GgufQuantAndItsVisionFile) {
  const std::vector<std::string> repo = {"README.md",
                                         "Qwen3-VL-2B-Instruct-F16.gguf",
                                         "Qwen3-VL-2B-Instruct-Q8_0.gguf",
                                         "Qwen3-VL-2B-Instruct-Q4_K_M.gguf",
                                         "Qwen3-VL-2B-Instruct-Q4_K_S.gguf",
                                         "mmproj-Qwen3-VL-2B-Instruct-F16.gguf",
                                         "mmproj-Qwen3-VL-2B-Instruct-Q8_0.gguf",
                                         "imatrix.gguf"};
  auto s = select_files(repo, "", "o/n");  // default: Q4_K_M
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->model, "Qwen3-VL-2B-Instruct-Q4_K_M.gguf");
  EXPECT_EQ(s->mmproj, "mmproj-Qwen3-VL-2B-Instruct-Q8_0.gguf");  // 8 bits: closest to 4
  EXPECT_EQ(s->files, (std::vector<std::string>{s->model, s->mmproj}));
  s = select_files(repo, "f16", "o/n");  // any case
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->model, "Qwen3-VL-2B-Instruct-F16.gguf");
  EXPECT_EQ(s->mmproj, "mmproj-Qwen3-VL-2B-Instruct-F16.gguf");
  s = select_files(repo, "Q4_K", "o/n");  // a tag must end at '.' or '-': Q4_K_M does not match
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("Qwen3-VL-2B-Instruct-Q4_K_S.gguf"), std::string::npos);
  // Without Q4_K_M: Q8_0; without either: the first model file.
  s = select_files({"m-F16.gguf", "m-Q8_0.gguf"}, "", "o/n");
  EXPECT_EQ(s->model, "m-Q8_0.gguf");
  EXPECT_EQ(s->mmproj, "");
  s = select_files({"m-BF16.gguf", "m-F32.gguf"}, "", "o/n");
  EXPECT_EQ(s->model, "m-BF16.gguf");
  // A tag is a word of its own: F16 is not BF16, whichever comes first.
  s = select_files({"m-BF16.gguf", "m-F16.gguf"}, "F16", "o/n");
  EXPECT_EQ(s->model, "m-F16.gguf");
  s = select_files({"m-BF16.gguf"}, "F16", "o/n");
  EXPECT_FALSE(s.ok());
  s = select_files({"F16.gguf", "sub/Q8_0.gguf"}, "q8_0", "o/n");
  EXPECT_EQ(s->model, "sub/Q8_0.gguf");
}

TEST(HubSelect, MmprojIsTakenFromTheModelsFolderOrAbove) {
  const std::vector<std::string> repo = {"a/m-Q8_0.gguf", "b/mmproj-F16.gguf", "mmproj-F32.gguf",
                                         "a/mmproj-F16.gguf"};
  auto s = select_files(repo, "Q8_0", "o/n");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->mmproj, "a/mmproj-F16.gguf");
  s = select_files({"a/m-Q8_0.gguf", "b/mmproj-F16.gguf", "mmproj-F32.gguf"}, "Q8_0", "o/n");
  EXPECT_EQ(s->mmproj, "mmproj-F32.gguf");
}

TEST(HubSelect, RefusesWhatVlmCannotLoad) {
  auto s =
      select_files({"m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"}, "Q8_0", "o/n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("split"), std::string::npos);
  s = select_files({"config.json", "model.safetensors"}, "Q4_K_M", "o/n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no GGUF files"), std::string::npos);
  s = select_files({"config.json", "pytorch_model.bin"}, "", "o/n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("pytorch_model.bin"), std::string::npos);
  s = select_files({"mmproj-F16.gguf"}, "", "o/n");
  EXPECT_FALSE(s.ok());
}

std::string hash_of(ContentHash::Kind kind, const std::string& bytes) {
  ContentHash h(kind, static_cast<int64_t>(bytes.size()));
  // In two pieces: the hash is incremental.
  h.update(bytes.data(), bytes.size() / 2);
  h.update(bytes.data() + bytes.size() / 2, bytes.size() - bytes.size() / 2);
  return h.hex();
}

TEST(HubHash, Sha256AndGitBlobSha1) {
  // FIPS 180-2's "abc" and git's `git hash-object` of "hello\n".
  EXPECT_EQ(hash_of(ContentHash::Kind::kSha256, "abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hash_of(ContentHash::Kind::kGitSha1, "hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a");
  // The empty blob: git's well-known e69de29... (the header alone).
  EXPECT_EQ(hash_of(ContentHash::Kind::kGitSha1, ""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
}

TEST(HubText, RepositoryPathsStayInsideTheSnapshot) {
  for (const char* ok : {"config.json", "a/b.gguf", ".gitattributes", "a/.hidden", "x..y"}) {
    EXPECT_TRUE(is_safe_repo_path(ok)) << ok;
  }
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", "..", ".",
                          "a\\..\\b", "a\nb"}) {
    EXPECT_FALSE(is_safe_repo_path(bad)) << bad;
  }
  RepoFile f;
  f.path = "model.safetensors";
  f.blob_id = std::string(40, 'a');
  EXPECT_TRUE(is_valid_repo_file(f));
  f.lfs_sha256 = "../../x";  // a hash names a blob file: hexadecimal only
  EXPECT_FALSE(is_valid_repo_file(f));
  f.lfs_sha256 = std::string(64, 'b');
  EXPECT_TRUE(is_valid_repo_file(f));
  f.blob_id = std::string(40, 'G');
  EXPECT_FALSE(is_valid_repo_file(f));
}

TEST(HubTree, ParsesTheHubsListingAndRefusesMalformedOnes) {
  const std::string page = R"([
    {"type": "directory", "oid": "x", "size": 0, "path": "sub"},
    {"type": "file", "oid": ")" +
                           std::string(40, 'a') + R"(", "size": 12, "path": "config.json"},
    {"type": "file", "oid": ")" +
                           std::string(40, 'b') + R"(", "size": 134,
     "path": "sub/model.safetensors", "xetHash": "ab12",
     "lfs": {"oid": ")" + std::string(64, 'c') +
                           R"(", "size": 4096, "pointerSize": 134}}])";
  auto files = parse_tree_page(page, "URL");
  ASSERT_TRUE(files.ok()) << files.status().message();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].etag(), std::string(40, 'a'));
  EXPECT_EQ((*files)[1].path, "sub/model.safetensors");
  EXPECT_EQ((*files)[1].size, 4096);  // the file's, not its pointer's
  EXPECT_EQ((*files)[1].etag(), std::string(64, 'c'));
  EXPECT_EQ((*files)[1].xet_hash, "ab12");
  for (const std::string& bad :
       std::vector<std::string>{"{}", "not json", R"([{"type": "file", "path": 5}])",
                                R"([{"type": "file", "oid": "zz", "size": 1, "path": "a"}])",
                                R"([{"type": "file", "oid": ")" + std::string(40, 'a') +
                                    R"(", "size": "1", "path": "a"}])",
                                R"([{"type": "file", "oid": ")" + std::string(40, 'a') +
                                    R"(", "size": 1, "path": "../a"}])"}) {
    auto r = parse_tree_page(bad, "URL");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  }
}

TEST(HubText, QuotingAndFolderNames) {
  EXPECT_EQ(url_quote("refs/pr/1", false), "refs%2Fpr%2F1");
  EXPECT_EQ(url_quote("sub dir/a+b.json", true), "sub%20dir/a%2Bb.json");
  EXPECT_EQ(repo_folder_name("Qwen/Qwen3-VL-2B-Instruct"), "models--Qwen--Qwen3-VL-2B-Instruct");
  EXPECT_EQ(repo_id_from_folder("models--Qwen--Qwen3-VL-2B-Instruct"), "Qwen/Qwen3-VL-2B-Instruct");
  EXPECT_EQ(repo_id_from_folder("datasets--a--b"), std::nullopt);
  EXPECT_TRUE(is_commit_hash(std::string(40, 'a')));
  EXPECT_FALSE(is_commit_hash(std::string(40, 'A')));
  EXPECT_FALSE(is_commit_hash("main"));
}

// A cache built by hand: two revisions of one model sharing a blob.
class HubCache : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/vlm_hub_cache_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    cache_ = dir;
    repo_ = cache_ / "models--o--n";
    o_.cache_dir = cache_.string();
    add_blob("shared", "config bytes");
    add_blob("old", "old weights!");
    add_blob("new", "new weights, longer");
    ASSERT_TRUE(link_snapshot_file(repo_, c_old_, "config.json", "shared").ok());
    ASSERT_TRUE(link_snapshot_file(repo_, c_old_, "model.safetensors", "old").ok());
    ASSERT_TRUE(link_snapshot_file(repo_, c_new_, "config.json", "shared").ok());
    ASSERT_TRUE(link_snapshot_file(repo_, c_new_, "sub/model.safetensors", "new").ok());
    ASSERT_TRUE(write_ref(repo_, "main", c_new_).ok());
    ASSERT_TRUE(write_ref(repo_, "refs/pr/1", c_old_).ok());
    fs::create_directories(cache_ / ".locks" / "models--o--n");
  }
  void TearDown() override { fs::remove_all(cache_); }
  void add_blob(const std::string& name, const std::string& bytes) {
    fs::create_directories(repo_ / "blobs");
    std::ofstream(repo_ / "blobs" / name) << bytes;
  }

  fs::path cache_, repo_;
  HubOptions o_;
  const std::string c_old_ = std::string(40, '1');
  const std::string c_new_ = std::string(40, '2');
};

TEST_F(HubCache, SnapshotLinksAreRelativeAndRefsHoldCommits) {
  EXPECT_EQ(fs::read_symlink(repo_ / "snapshots" / c_new_ / "sub/model.safetensors"),
            fs::path("../../../blobs/new"));
  EXPECT_EQ(fs::read_symlink(repo_ / "snapshots" / c_new_ / "config.json"),
            fs::path("../../blobs/shared"));
  EXPECT_EQ(read_ref(repo_, "main"), c_new_);
  EXPECT_EQ(read_ref(repo_, "refs/pr/1"), c_old_);
  EXPECT_EQ(read_ref(repo_, "dev"), std::nullopt);
  EXPECT_EQ(snapshot_files(repo_ / "snapshots" / c_new_),
            (std::vector<std::string>{"config.json", "sub/model.safetensors"}));
}

TEST_F(HubCache, TreeListingRoundTrip) {
  RepoFile a;
  a.path = "model.safetensors";
  a.size = 19;
  a.blob_id = std::string(40, 'b');
  a.lfs_sha256 = std::string(64, 'c');
  RepoFile b;
  b.path = "config.json";
  b.size = 12;
  b.blob_id = std::string(40, 'd');
  ASSERT_TRUE(write_tree_cache(repo_, c_new_, {a, b}).ok());
  auto t = read_tree_cache(repo_, c_new_);
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].path, "config.json");  // sorted, as huggingface_hub writes it
  EXPECT_EQ((*t)[0].etag(), b.blob_id);
  EXPECT_EQ((*t)[1].etag(), a.lfs_sha256);
  EXPECT_EQ((*t)[1].size, 19);
  for (const char* bad :
       {R"({"format_version": 2, "files": {}})", R"({"format_version": "1", "files": {}})",
        R"({"format_version": 1, "files": {"a": {"size": "1", "blob_id": "x"}}})",
        R"({"format_version": 1, "files": {"../a": {"size": 1, "blob_id":
            "0000000000000000000000000000000000000000"}}})",
        "[1, 2"}) {
    std::ofstream(repo_ / "trees" / (c_old_ + ".json")) << bad;
    EXPECT_FALSE(read_tree_cache(repo_, c_old_).has_value()) << bad;
  }
}

TEST_F(HubCache, ListsModelsWithRevisionsAndSizes) {
  auto models = list_cached(o_);
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->size(), 1u);
  const CachedModel& m = (*models)[0];
  EXPECT_EQ(m.name, "o/n");
  EXPECT_EQ(m.size, 12 + 12 + 19);  // each blob once
  ASSERT_EQ(m.revisions.size(), 2u);
  EXPECT_EQ(m.revisions[0].commit, c_old_);
  EXPECT_EQ(m.revisions[0].refs, std::vector<std::string>{"refs/pr/1"});
  EXPECT_EQ(m.revisions[0].files, 2);
  EXPECT_EQ(m.revisions[0].size, 24);
  EXPECT_EQ(m.revisions[1].refs, std::vector<std::string>{"main"});
  EXPECT_EQ(m.revisions[1].size, 31);
}

TEST_F(HubCache, RemovesOneRevisionKeepingSharedBlobs) {
  ModelName n;
  n.repo_id = "o/n";
  n.revision = "refs/pr/1";
  n.revision_given = true;
  auto freed = remove_cached(n, o_);
  ASSERT_TRUE(freed.ok()) << freed.status().message();
  EXPECT_EQ(*freed, 12);  // "old weights!" only
  EXPECT_FALSE(fs::exists(repo_ / "blobs" / "old"));
  EXPECT_TRUE(fs::exists(repo_ / "blobs" / "shared"));
  EXPECT_FALSE(fs::exists(repo_ / "snapshots" / c_old_));
  EXPECT_FALSE(fs::exists(repo_ / "refs" / "refs/pr/1"));
  EXPECT_EQ(read_ref(repo_, "main"), c_new_);
  n.revision = "v9";
  EXPECT_FALSE(remove_cached(n, o_).ok());
  n.revision = c_new_;  // the last revision: the whole folder goes
  ASSERT_TRUE(remove_cached(n, o_).ok());
  EXPECT_FALSE(fs::exists(repo_));
  EXPECT_FALSE(fs::exists(cache_ / ".locks" / "models--o--n"));
}

TEST_F(HubCache, RemovingARevisionLeavesASharedStoreAlone) {
  // huggingface_hub's shared blob store: blobs/<etag> a link to a file outside the model.
  fs::create_directories(cache_ / "blobs" / "ab");
  std::ofstream(cache_ / "blobs" / "ab" / "xethash") << "weights in the store";
  fs::remove(repo_ / "blobs" / "old");
  fs::create_symlink("../../blobs/ab/xethash", repo_ / "blobs" / "old");
  ModelName n;
  n.repo_id = "o/n";
  n.revision = "refs/pr/1";
  n.revision_given = true;
  auto freed = remove_cached(n, o_);
  ASSERT_TRUE(freed.ok()) << freed.status().message();
  EXPECT_EQ(*freed, 0);  // a link's removal frees no bytes of this model
  EXPECT_FALSE(fs::is_symlink(repo_ / "blobs" / "old"));
  EXPECT_TRUE(fs::exists(cache_ / "blobs" / "ab" / "xethash"));  // the store keeps its file
  EXPECT_TRUE(fs::exists(repo_ / "blobs" / "shared"));
}

TEST_F(HubCache, RemovesAWholeModel) {
  ModelName n;
  n.repo_id = "o/n";
  auto freed = remove_cached(n, o_);
  ASSERT_TRUE(freed.ok());
  EXPECT_GE(*freed, 12 + 12 + 19);
  EXPECT_FALSE(fs::exists(repo_));
  EXPECT_FALSE(fs::exists(cache_ / ".locks" / "models--o--n"));
  auto again = remove_cached(n, o_);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("not in the cache"), std::string::npos);
}

TEST_F(HubCache, OfflineResolveUsesTheCachedSnapshot) {
  o_.offline = true;
  ModelName n;
  n.repo_id = "o/n";
  n.revision = "refs/pr/1";
  n.revision_given = true;
  auto m = resolve(n, o_);  // no tree listing: the snapshot's files are the list
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->commit, c_old_);
  EXPECT_EQ(m->path, (repo_ / "snapshots" / c_old_).string());
  n.revision = "main";  // its weights are in a subfolder: no checkpoint vlm loads
  EXPECT_FALSE(resolve(n, o_).ok());
  n.repo_id = "o/missing";
  m = resolve(n, o_);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("HF_HUB_OFFLINE"), std::string::npos);
}

}  // namespace
}  // namespace vlm::hub
