// A model name to files in the cache: the revision's commit and file list from the hub (or the
// cache, offline or when the hub cannot be reached), the files vlm needs, what is missing
// downloaded.
#include <nlohmann/json.hpp>

#include "hub/hub_download.h"
#include "hub/hub_internal.h"

namespace vlm::hub {
namespace {

using nlohmann::json;

// The next page of a paginated listing: Link: <URL>; rel="next".
std::string next_page(const HttpResult& r) {
  auto it = r.headers.find("link");
  if (it == r.headers.end()) return "";
  const std::string& link = it->second;
  for (size_t at = 0; at < link.size();) {
    const size_t open = link.find('<', at), close = link.find('>', open);
    if (open == std::string::npos || close == std::string::npos) break;
    const size_t end = std::min(link.find(',', close), link.size());
    if (link.substr(close, end - close).find("rel=\"next\"") != std::string::npos) {
      return link.substr(open + 1, close - open - 1);
    }
    at = end + 1;
  }
  return "";
}

Result<std::string> fetch_commit(HttpClient& client, const ModelName& name, const HubOptions& o,
                                 HttpResult* failed) {
  const std::string url = o.endpoint + "/api/models/" + name.repo_id + "/revision/" +
                          url_quote(name.revision, /*safe_slash=*/false);
  HttpResult r = client.get(url);
  if (r.status != 200) {
    *failed = r;
    return hub_error(r, name.repo_id, "revision " + name.revision, o);
  }
  const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("sha") || !j["sha"].is_string() ||
      !is_commit_hash(j["sha"].get<std::string>())) {
    return data_loss(url + " gave no commit hash (\"sha\"): is HF_ENDPOINT a Hugging Face hub?");
  }
  return j["sha"].get<std::string>();
}

Result<std::vector<RepoFile>> fetch_tree(HttpClient& client, const std::string& repo_id,
                                         const std::string& commit, const HubOptions& o,
                                         HttpResult* failed) {
  std::vector<RepoFile> files;
  std::string url =
      o.endpoint + "/api/models/" + repo_id + "/tree/" + commit + "?recursive=true&expand=false";
  while (!url.empty()) {
    HttpResult r = client.get(url);
    if (r.status != 200) {
      *failed = r;
      return hub_error(r, repo_id, "revision " + commit, o);
    }
    const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) return data_loss(url + " gave no file list");
    for (const json& e : j) {
      if (!e.is_object() || e.value("type", "") != "file") continue;
      RepoFile f;
      f.path = e.value("path", "");
      f.size = e.value("size", int64_t{0});
      f.blob_id = e.value("oid", "");
      if (e.contains("lfs") && e["lfs"].is_object()) {
        f.lfs_sha256 = e["lfs"].value("oid", "");
        f.size = e["lfs"].value("size", f.size);
      }
      if (!is_valid_repo_file(f)) {
        return data_loss(url + " lists a file the cache cannot hold: path '" + f.path +
                         "', hash '" + f.etag() + "' (a path must stay inside the repository)");
      }
      files.push_back(std::move(f));
    }
    url = next_page(r);
  }
  return files;
}

std::vector<std::string> paths_of(const std::vector<RepoFile>& files) {
  std::vector<std::string> out;
  for (const RepoFile& f : files) out.push_back(f.path);
  return out;
}

LocalModel local_model(const fs::path& repo_dir, const std::string& repo_id,
                       const std::string& commit, const Selection& sel) {
  const fs::path snapshot = repo_dir / "snapshots" / commit;
  LocalModel m;
  m.path = sel.model.empty() ? snapshot.string() : (snapshot / sel.model).string();
  if (!sel.mmproj.empty()) m.mmproj = (snapshot / sel.mmproj).string();
  m.repo_id = repo_id;
  m.commit = commit;
  return m;
}

// The revision from the cache alone; `why` says why the hub is not asked.
Result<LocalModel> from_cache(const ModelName& name, const HubOptions& o, const fs::path& repo_dir,
                              const std::string& why) {
  std::optional<std::string> commit;
  if (is_commit_hash(name.revision)) {
    commit = name.revision;
  } else {
    commit = read_ref(repo_dir, name.revision);
  }
  std::error_code ec;
  const fs::path snapshot = repo_dir / "snapshots" / commit.value_or("-");
  if (!commit || !fs::is_directory(snapshot, ec)) {
    return not_found(why + ", and " + name.repo_id + "@" + name.revision + " is not in the cache " +
                     o.cache_dir);
  }
  const auto tree = read_tree_cache(repo_dir, *commit);
  const std::vector<std::string> paths = tree ? paths_of(*tree) : snapshot_files(snapshot);
  VLM_ASSIGN_OR_RETURN(Selection sel, select_files(paths, name.quant, name.repo_id, o.weights));
  for (const std::string& p : sel.files) {
    if (!fs::exists(snapshot / p, ec)) {
      return not_found(why + ", and the cached " + name.repo_id + " (" + *commit + ") lacks " + p +
                       ": it was downloaded in part");
    }
  }
  return local_model(repo_dir, name.repo_id, *commit, sel);
}

// The hub could not be asked (no answer, or a server error): the cache, with a note, else the
// hub's error.
Result<LocalModel> unreachable(const ModelName& name, const HubOptions& o, const fs::path& repo_dir,
                               const HttpResult& failed, const Status& error) {
  if (failed.status != 0 && failed.status < 500) return error;
  auto cached = from_cache(name, o, repo_dir, error.message());
  if (!cached.ok()) return cached.status();
  if (o.progress != Progress::kQuiet) {
    std::fprintf(o.log, "vlm: %s; using the cached %s (%s)\n", error.message().c_str(),
                 name.repo_id.c_str(), cached->commit.c_str());
  }
  return cached;
}

}  // namespace

Result<LocalModel> resolve(const ModelName& name, const HubOptions& o) {
  if (o.cache_dir.empty())
    return invalid_argument("no Hugging Face cache folder (set HF_HUB_CACHE)");
  const fs::path repo_dir = fs::path(o.cache_dir) / repo_folder_name(name.repo_id);
  if (o.offline) return from_cache(name, o, repo_dir, "HF_HUB_OFFLINE is set (offline mode)");
  HttpClient client(o);
  HttpResult failed;
  std::string commit = name.revision;
  if (!is_commit_hash(commit)) {
    auto c = fetch_commit(client, name, o, &failed);
    if (!c.ok()) return unreachable(name, o, repo_dir, failed, c.status());
    commit = *c;
  }
  auto tree = read_tree_cache(repo_dir, commit);
  if (!tree) {
    auto listed = fetch_tree(client, name.repo_id, commit, o, &failed);
    if (!listed.ok()) return unreachable(name, o, repo_dir, failed, listed.status());
    tree = std::move(*listed);
    VLM_RETURN_IF_ERROR(write_tree_cache(repo_dir, commit, *tree));
  }
  VLM_ASSIGN_OR_RETURN(Selection sel,
                       select_files(paths_of(*tree), name.quant, name.repo_id, o.weights));
  std::vector<RepoFile> missing;
  std::error_code ec;
  for (const RepoFile& f : *tree) {
    const bool wanted = std::find(sel.files.begin(), sel.files.end(), f.path) != sel.files.end();
    if (wanted && !fs::exists(repo_dir / "snapshots" / commit / f.path, ec)) missing.push_back(f);
  }
  tag_cache_dir(o.cache_dir);
  int64_t bytes = 0;
  if (!missing.empty()) {
    Downloader d(o, repo_dir, name.repo_id, commit);
    VLM_RETURN_IF_ERROR(d.run(missing));
    bytes = d.bytes_downloaded();
  }
  if (!is_commit_hash(name.revision))
    VLM_RETURN_IF_ERROR(write_ref(repo_dir, name.revision, commit));
  LocalModel m = local_model(repo_dir, name.repo_id, commit, sel);
  m.files_downloaded = static_cast<int>(missing.size());
  m.bytes_downloaded = bytes;
  return m;
}

}  // namespace vlm::hub
