// The Hugging Face cache on disk: refs, snapshots, the tree listings, `vlm ls` and `vlm rm`.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "hub/hub_internal.h"

namespace vlm::hub {
namespace {

using nlohmann::json;

// Writes `text` to `p` through a temporary file renamed over it (readers never see half a file).
Status write_file_atomic(const fs::path& p, const std::string& text) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  const fs::path tmp = p.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.flush()) return unavailable("cannot write " + tmp.string());
  }
  fs::rename(tmp, p, ec);
  if (ec) return unavailable("cannot write " + p.string() + ": " + ec.message());
  return ok_status();
}

int64_t mtime_of(const fs::path& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : 0;
}

// The blobs a snapshot's files are: each link's target taken lexically (blobs/<etag>, itself a
// file, or in huggingface_hub's shared store a link to one elsewhere), or a plain file itself;
// with the bytes each holds. Dangling links are left out.
std::map<std::string, int64_t> snapshot_blobs(const fs::path& snapshot, int64_t* files) {
  std::map<std::string, int64_t> blobs;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(snapshot, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) continue;
    fs::path blob = it->path();
    if (it->is_symlink(ec)) {
      blob = (it->path().parent_path() / fs::read_symlink(it->path(), ec)).lexically_normal();
    }
    const auto size = fs::file_size(blob, ec);  // through a shared-store link to its file
    if (ec) {
      ec.clear();
      continue;
    }
    ++*files;
    blobs[blob.string()] = static_cast<int64_t>(size);
  }
  return blobs;
}

// refs/<name> files: commit → the names (relative to refs/) that hold it.
std::map<std::string, std::vector<std::string>> read_refs(const fs::path& repo_dir) {
  std::map<std::string, std::vector<std::string>> by_commit;
  std::error_code ec;
  const fs::path refs = repo_dir / "refs";
  for (auto it = fs::recursive_directory_iterator(refs, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string commit = trim_space(read_text(it->path()));
    by_commit[commit].push_back(it->path().lexically_relative(refs).generic_string());
  }
  return by_commit;
}

CachedModel scan_repo(const fs::path& repo_dir, const std::string& repo_id) {
  CachedModel m;
  m.name = repo_id;
  m.path = repo_dir.string();
  const auto refs = read_refs(repo_dir);
  std::map<std::string, int64_t> all_blobs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(repo_dir / "snapshots", ec)) {
    if (!e.is_directory(ec)) continue;
    CachedRevision r;
    r.commit = e.path().filename().string();
    r.path = e.path().string();
    const auto blobs = snapshot_blobs(e.path(), &r.files);
    for (const auto& [path, size] : blobs) r.size += size;
    all_blobs.insert(blobs.begin(), blobs.end());
    if (auto it = refs.find(r.commit); it != refs.end()) r.refs = it->second;
    m.modified = std::max(m.modified, mtime_of(e.path()));
    m.revisions.push_back(std::move(r));
  }
  for (const auto& [path, size] : all_blobs) {
    m.size += size;
    m.modified = std::max(m.modified, mtime_of(path));
  }
  std::sort(m.revisions.begin(), m.revisions.end(),
            [](const CachedRevision& a, const CachedRevision& b) { return a.commit < b.commit; });
  return m;
}

int64_t bytes_under(const fs::path& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) && !it->is_symlink(ec))
      n += static_cast<int64_t>(it->file_size(ec));
  }
  return n;
}

Result<int64_t> remove_revision(const fs::path& repo_dir, const ModelName& name,
                                const HubOptions& options) {
  std::string commit = name.revision;
  if (!is_commit_hash(commit)) {
    auto ref = read_ref(repo_dir, name.revision);
    if (!ref) {
      return not_found(name.repo_id + " has no revision " + name.revision + " in the cache " +
                       options.cache_dir);
    }
    commit = *ref;
  }
  const fs::path snapshot = repo_dir / "snapshots" / commit;
  std::error_code ec;
  if (!fs::is_directory(snapshot, ec)) {
    return not_found(name.repo_id + "@" + name.revision + " (" + commit + ") is not in the cache " +
                     options.cache_dir);
  }
  int64_t unused = 0;
  auto doomed = snapshot_blobs(snapshot, &unused);
  for (const auto& e : fs::directory_iterator(repo_dir / "snapshots", ec)) {
    if (e.path() == snapshot) continue;
    for (const auto& [path, size] : snapshot_blobs(e.path(), &unused)) doomed.erase(path);
  }
  // Only this model's own blobs/ entries go; a link into a shared store frees nothing here.
  const std::string own = (repo_dir / "blobs").lexically_normal().string() + "/";
  int64_t freed = 0;
  for (const auto& [path, size] : doomed) {
    if (path.rfind(own, 0) != 0) continue;
    const bool link = fs::is_symlink(path, ec);
    if (fs::remove(path, ec) && !link) freed += size;
  }
  fs::remove_all(snapshot, ec);
  fs::remove(repo_dir / "trees" / (commit + ".json"), ec);
  for (const auto& [c, names] : read_refs(repo_dir)) {
    if (c != commit) continue;
    for (const std::string& r : names) fs::remove(repo_dir / "refs" / r, ec);
  }
  return freed;
}

}  // namespace

std::optional<std::vector<RepoFile>> read_tree_cache(const fs::path& repo_dir,
                                                     const std::string& commit) {
  const std::string text = read_text(repo_dir / "trees" / (commit + ".json"));
  if (text.empty()) return std::nullopt;
  try {
    const json j = json::parse(text);
    if (!j.is_object() || j.value("format_version", 0) != 1 || !j.at("files").is_object()) {
      return std::nullopt;
    }
    std::vector<RepoFile> files;
    for (const auto& [path, info] : j["files"].items()) {
      RepoFile f;
      f.path = path;
      f.size = info.at("size").get<int64_t>();
      f.blob_id = info.at("blob_id").get<std::string>();
      if (info.contains("lfs_sha256") && !info["lfs_sha256"].is_null()) {
        f.lfs_sha256 = info["lfs_sha256"].get<std::string>();
        f.size = info.value("lfs_size", f.size);
      }
      if (info.contains("xet_hash") && !info["xet_hash"].is_null()) {
        f.xet_hash = info["xet_hash"].get<std::string>();
      }
      if (!is_valid_repo_file(f)) return std::nullopt;  // listed again from the hub
      files.push_back(std::move(f));
    }
    return files;
  } catch (const json::exception&) {  // not JSON, or a field of another type
    return std::nullopt;
  }
}

Result<std::vector<RepoFile>> parse_tree_page(const std::string& body, const std::string& url) {
  std::vector<RepoFile> files;
  try {
    const json j = json::parse(body);
    if (!j.is_array()) return data_loss(url + " gave no file list");
    for (const json& e : j) {
      if (e.at("type").get<std::string>() != "file") continue;
      RepoFile f;
      f.path = e.at("path").get<std::string>();
      f.size = e.at("size").get<int64_t>();
      f.blob_id = e.at("oid").get<std::string>();
      if (e.contains("lfs") && !e["lfs"].is_null()) {
        f.lfs_sha256 = e["lfs"].at("oid").get<std::string>();
        f.size = e["lfs"].value("size", f.size);
      }
      if (e.contains("xetHash") && !e["xetHash"].is_null()) {
        f.xet_hash = e["xetHash"].get<std::string>();
      }
      if (!is_valid_repo_file(f)) {
        return data_loss(url + " lists a file the cache cannot hold: " + printable(f.path) +
                         " (a path must stay inside the repository; hashes are hexadecimal)");
      }
      files.push_back(std::move(f));
    }
  } catch (const json::exception& e) {
    return data_loss(url + " gave a malformed file list: " + e.what());
  }
  return files;
}

Status write_tree_cache(const fs::path& repo_dir, const std::string& commit,
                        const std::vector<RepoFile>& files) {
  json out = json::object();
  for (const RepoFile& f : files) {
    json info = {{"size", f.size}, {"blob_id", f.blob_id}};
    if (!f.lfs_sha256.empty()) {
      info["lfs_sha256"] = f.lfs_sha256;
      info["lfs_size"] = f.size;
    }
    if (!f.xet_hash.empty()) info["xet_hash"] = f.xet_hash;
    out[f.path] = std::move(info);
  }
  const json doc = {{"format_version", 1}, {"files", std::move(out)}};
  return write_file_atomic(repo_dir / "trees" / (commit + ".json"), doc.dump(1));
}

std::optional<std::string> read_ref(const fs::path& repo_dir, const std::string& revision) {
  std::error_code ec;
  const fs::path p = repo_dir / "refs" / revision;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  const std::string commit = trim_space(read_text(p));
  if (!is_commit_hash(commit)) return std::nullopt;
  return commit;
}

Status write_ref(const fs::path& repo_dir, const std::string& revision, const std::string& commit) {
  if (read_ref(repo_dir, revision) == commit) return ok_status();
  return write_file_atomic(repo_dir / "refs" / revision, commit);
}

std::vector<std::string> snapshot_files(const fs::path& snapshot) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(snapshot, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) continue;
    if (fs::exists(it->path(), ec)) {
      out.push_back(it->path().lexically_relative(snapshot).generic_string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status link_snapshot_file(const fs::path& repo_dir, const std::string& commit,
                          const std::string& path, const std::string& etag) {
  const fs::path pointer = repo_dir / "snapshots" / commit / path;
  const fs::path blob = repo_dir / "blobs" / etag;
  std::error_code ec;
  fs::create_directories(pointer.parent_path(), ec);
  if (ec)
    return unavailable("cannot create " + pointer.parent_path().string() + ": " + ec.message());
  // Lexically, as huggingface_hub's os.path.relpath (symlinks on the way are not resolved).
  const fs::path target = fs::absolute(blob).lexically_normal().lexically_relative(
      fs::absolute(pointer.parent_path()).lexically_normal());
  // Made aside, then renamed over the pointer: another process linking the same file at the
  // same time cannot make this fail.
  const fs::path tmp = pointer.string() + ".link" + std::to_string(::getpid()) + "." +
                       std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp, ec);
  if (!ec) fs::rename(tmp, pointer, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return unavailable("cannot link " + pointer.string() + ": " + ec.message());
  }
  return ok_status();
}

void tag_cache_dir(const fs::path& cache_dir) {
  const fs::path tag = cache_dir / "CACHEDIR.TAG";
  std::error_code ec;
  if (fs::exists(tag, ec)) return;
  std::ofstream f(tag);
  f << "Signature: 8a477f597d28d172789f06886806bc55\n"
       "# This file is a cache directory tag created by huggingface_hub.\n"
       "# For information about cache directory tags, see:\n"
       "#\thttps://bford.info/cachedir/\n";
}

Result<std::vector<CachedModel>> list_cached(const HubOptions& options) {
  std::vector<CachedModel> out;
  std::error_code ec;
  if (!fs::is_directory(options.cache_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(options.cache_dir, ec)) {
    const auto id = repo_id_from_folder(e.path().filename().string());
    if (!id || !e.is_directory(ec)) continue;
    out.push_back(scan_repo(e.path(), *id));
  }
  std::sort(out.begin(), out.end(),
            [](const CachedModel& a, const CachedModel& b) { return a.name < b.name; });
  return out;
}

Result<int64_t> remove_cached(const ModelName& name, const HubOptions& options) {
  const fs::path repo_dir = fs::path(options.cache_dir) / repo_folder_name(name.repo_id);
  std::error_code ec;
  if (!fs::is_directory(repo_dir, ec)) {
    return not_found(name.repo_id + " is not in the cache " + options.cache_dir);
  }
  if (name.revision_given) {
    VLM_ASSIGN_OR_RETURN(int64_t freed, remove_revision(repo_dir, name, options));
    if (snapshot_files(repo_dir / "snapshots").empty()) {  // nothing left: the whole folder
      freed += bytes_under(repo_dir);
      fs::remove_all(repo_dir, ec);
      fs::remove_all(fs::path(options.cache_dir) / ".locks" / repo_folder_name(name.repo_id), ec);
    }
    return freed;
  }
  const int64_t freed = bytes_under(repo_dir);
  fs::remove_all(repo_dir, ec);
  if (ec) return unavailable("cannot remove " + repo_dir.string() + ": " + ec.message());
  fs::remove_all(fs::path(options.cache_dir) / ".locks" / repo_folder_name(name.repo_id), ec);
  return freed;
}

}  // namespace vlm::hub
