// vlm public API: models by name. `ORG/NAME[@REVISION][:QUANT]` resolves through the Hugging Face
// cache, laid out exactly as huggingface_hub lays it out (models--ORG--NAME/{blobs,refs,snapshots,
// trees}, .locks/), so a model any Hugging Face tool downloaded is used as is and what vlm
// downloads is theirs too. What is missing comes from the hub's HTTP API (HF_ENDPOINT): the files
// vlm loads (no weights in other formats), resumable, checked against the hub's hashes, several at
// once. Thread-safety: the functions share no state; two processes downloading the same file take
// turns on its lock in .locks/ (as huggingface_hub's do).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/status.h"

namespace vlm::hub {

// A model's name: ORG/NAME, optionally @REVISION (a branch, a tag or a commit hash; default main)
// and :QUANT (a GGUF repository's quantization, e.g. Q4_K_M, as llama.cpp's -hf takes it).
struct ModelName {
  std::string repo_id;  // ORG/NAME
  std::string revision = "main";
  bool revision_given = false;
  std::string quant;        // "" = none
  std::string str() const;  // as written: ORG/NAME[@REVISION][:QUANT]
};

// Parses a name; the error says what is wrong with it.
Result<ModelName> parse_model_name(std::string_view text);

// True when `arg` names a model rather than a file: no file or folder `arg` exists and it reads as
// ORG/NAME[@REVISION][:QUANT] (a path that exists always wins, as in vLLM).
bool is_model_name(const std::string& arg);

enum class Progress { kAuto, kBar, kLines, kQuiet };

struct HubOptions {
  std::string endpoint;   // HF_ENDPOINT, else https://huggingface.co
  std::string cache_dir;  // HF_HUB_CACHE, else $HF_HOME/hub
  std::string token;      // "" = none
  bool offline = false;   // HF_HUB_OFFLINE: the cache only, no request
  int max_workers = 8;    // files downloaded at once
  // false: a safetensors checkpoint without its *.safetensors (what the tokenizer needs alone:
  // `vlm tokenize`); a GGUF file holds both, so it comes whole.
  bool weights = true;
  // kAuto: a bar redrawn in place when `log` is a terminal, else one plain line per file.
  Progress progress = Progress::kAuto;
  std::FILE* log = stderr;  // progress and notes
};

// The options as huggingface_hub reads its environment: HF_ENDPOINT; HF_HUB_CACHE (or the older
// HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub (HF_HOME defaulting to $XDG_CACHE_HOME/huggingface,
// else ~/.cache/huggingface); HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE); the token: `token` when
// not empty (--hf-token), else HF_TOKEN (or HUGGING_FACE_HUB_TOKEN), else the file HF_TOKEN_PATH,
// else $HF_HOME/token.
HubOptions options_from_env(const std::string& token = "");

// A model in the cache, ready to load.
struct LocalModel {
  std::string path;    // the snapshot folder, or for a GGUF repository its .gguf file
  std::string mmproj;  // a GGUF repository's vision file ("" when it has none)
  std::string repo_id;
  std::string commit;
  int files_downloaded = 0;
  int64_t bytes_downloaded = 0;
};

// The model's files in the cache; online (not offline) the revision is looked up on the hub and
// what is missing is downloaded first. When the hub cannot be reached the cached snapshot of the
// revision is used (a note says so).
Result<LocalModel> resolve(const ModelName& name, const HubOptions& options);

struct CachedRevision {
  std::string commit;
  std::vector<std::string> refs;  // branches and tags naming it
  std::string path;               // the snapshot folder
  int64_t files = 0;
  int64_t size = 0;  // bytes of its files
};

struct CachedModel {
  std::string name;      // ORG/NAME
  std::string path;      // models--ORG--NAME
  int64_t size = 0;      // bytes on disk, each blob counted once
  int64_t modified = 0;  // Unix time of its newest blob or snapshot
  std::vector<CachedRevision> revisions;
};

// Every model in the cache, by name.
Result<std::vector<CachedModel>> list_cached(const HubOptions& options);

// Removes a model from the cache: all of it, or (name.revision_given) that revision alone (its
// snapshot, the refs naming it, and the blobs no other snapshot uses). Returns the bytes freed.
Result<int64_t> remove_cached(const ModelName& name, const HubOptions& options);

}  // namespace vlm::hub
