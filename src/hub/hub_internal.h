// The hub layer's own declarations: the cache's layout, the choice of files, the HTTP client and
// the content hashes (include/vlm/hub.h is what the rest of vlm sees).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "vlm/hub.h"

namespace vlm::hub {

namespace fs = std::filesystem;

// ---- The cache's layout (huggingface_hub's: file_download.py, _tree_cache.py) ----

// models--ORG--NAME
std::string repo_folder_name(const std::string& repo_id);
// ORG/NAME from a folder name; nullopt when it is not models--...
std::optional<std::string> repo_id_from_folder(const std::string& folder);
// 40 lowercase hexadecimal digits.
bool is_commit_hash(const std::string& s);
// `n` lowercase hexadecimal digits (a blob's SHA-1, 40, or SHA-256, 64).
bool is_hex(const std::string& s, size_t n);
// A path in a repository that stays inside a snapshot folder when joined to it: relative, '/'
// separated, no empty, "." or ".." part, no backslash or control character.
bool is_safe_repo_path(const std::string& path);
// A tree entry the cache can hold: a safe path, a size, and hexadecimal hashes (they name files).
struct RepoFile;
bool is_valid_repo_file(const RepoFile& f);

// One file of a repository at a commit, as the hub's tree listing gives it.
struct RepoFile {
  std::string path;
  int64_t size = 0;
  std::string blob_id;     // git blob SHA-1
  std::string lfs_sha256;  // "" when the file is not in LFS
  std::string xet_hash;    // "" when the hub gave none (kept in trees/ for huggingface_hub)
  // The name of its blob in the cache (huggingface_hub's etag): the SHA-256 for LFS files, else
  // the git blob SHA-1.
  const std::string& etag() const { return lfs_sha256.empty() ? blob_id : lfs_sha256; }
};

// trees/<commit>.json (format_version 1): nullopt when absent, unreadable, of another format or
// holding an entry the cache cannot hold.
std::optional<std::vector<RepoFile>> read_tree_cache(const fs::path& repo_dir,
                                                     const std::string& commit);
Status write_tree_cache(const fs::path& repo_dir, const std::string& commit,
                        const std::vector<RepoFile>& files);
// The commit refs/<revision> names, if that file exists.
std::optional<std::string> read_ref(const fs::path& repo_dir, const std::string& revision);
Status write_ref(const fs::path& repo_dir, const std::string& revision, const std::string& commit);
// Paths under snapshots/<commit>, relative, '/'-separated (what a snapshot made without a tree
// listing holds).
std::vector<std::string> snapshot_files(const fs::path& snapshot);
// snapshots/<commit>/<path> → ../../blobs/<etag> (relative, as huggingface_hub links them).
Status link_snapshot_file(const fs::path& repo_dir, const std::string& commit,
                          const std::string& path, const std::string& etag);
// CACHEDIR.TAG (the Cache Directory Tagging Standard), as huggingface_hub writes it.
void tag_cache_dir(const fs::path& cache_dir);

// One page of the hub's tree listing (a JSON array): its files; an error naming `url` when the
// page is malformed or lists a file the cache cannot hold.
Result<std::vector<RepoFile>> parse_tree_page(const std::string& body, const std::string& url);

// ---- Which files vlm needs ----

struct Selection {
  std::vector<std::string> files;  // to have in the snapshot
  std::string model;               // a GGUF repository's model file ("" = the snapshot folder)
  std::string mmproj;              // its vision file ("" = none)
};

// From a repository's file list: a safetensors checkpoint's top-level files but weights in other
// formats (.bin, .pth, .gguf, ...), or (`quant` given, or no safetensors) one GGUF model file
// chosen by its quantization as llama.cpp's -hf chooses it (default Q4_K_M, then Q8_0, then the
// first) and the mmproj beside it closest to it in bits.
// `weights` false: the checkpoint's files but its *.safetensors.
Result<Selection> select_files(const std::vector<std::string>& paths, const std::string& quant,
                               const std::string& repo_id, bool weights = true);

// ---- Hashes (Nettle) ----

// SHA-256 of a file's bytes (an LFS file's etag), or git's blob SHA-1 ("blob <size>\0" then the
// bytes; a regular file's etag).
class ContentHash {
 public:
  enum class Kind { kSha256, kGitSha1 };
  ContentHash(Kind kind, int64_t size);
  void update(const void* data, size_t n);
  std::string hex();  // lowercase; the object is spent

 private:
  Kind kind_;
  alignas(8) unsigned char ctx_[256];
};

// ---- HTTP (libcurl) ----

struct HttpResult {
  long status = 0;                             // 0: no answer (see `transport_error`)
  std::map<std::string, std::string> headers;  // the last answer's, names lowercased
  std::string body;
  std::string transport_error;  // curl's message when the request did not complete
};

class HttpClient {
 public:
  explicit HttpClient(const HubOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET, following redirects; the body in memory.
  HttpResult get(const std::string& url, int timeout_s = 60);

  // GET into `fd` (opened for append) from byte `offset` on (a Range request when offset > 0),
  // following redirects, at most `size` bytes in all. `sink` gets every byte written (after a
  // 200 answer to a Range request: `restart` first, the file emptied, then everything). Returns
  // the result without the body; `write_errno` is set when writing failed, `overflow` when the
  // answer ran past `size`.
  struct Download {
    HttpResult result;
    int write_errno = 0;
    bool cancelled = false;
    bool overflow = false;
  };
  Download download(const std::string& url, int fd, int64_t offset, int64_t size,
                    const std::function<void(const void*, size_t)>& sink,
                    const std::function<void()>& restart, const std::atomic<bool>* cancel);

 private:
  void* curl_;
  void* headers_;
};

// A request's answer that is no success, as a Status naming the repository and what to do.
Status hub_error(const HttpResult& r, const std::string& repo_id, const std::string& what,
                 const HubOptions& options);

// Percent-encoding: `safe_slash` keeps '/' (paths in a repository); else '/' too is encoded
// (a revision such as refs/pr/1, as huggingface_hub quotes it).
std::string url_quote(const std::string& s, bool safe_slash);

// ASCII case and surrounding white space.
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string trim_space(std::string s);
// A file's whole text ("" when it cannot be read).
std::string read_text(const fs::path& p);
// Text from the hub made printable and quoted (a JSON string), for error messages.
std::string printable(const std::string& s);

}  // namespace vlm::hub
