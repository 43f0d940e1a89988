// A model name to files in the cache: the revision's commit and file list from the hub (or the
// cache, offline or when the hub cannot be reached), the files vlm needs, what is missing
// downloaded.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "hub/hub_download.h"
#include "hub/hub_internal.h"
#include "vlm/log.h"

namespace vlm::hub {
namespace {

using nlohmann::json;

constexpr int kMaxTreePages = 10000;

// The next page of a paginated listing: Link: <URL>; rel="next", on the hub's own origin (the
// token goes with it); "" at the end.
Result<std::string> next_page(const HttpResult& r, const HubOptions& o) {
  auto it = r.headers.find("link");
  if (it == r.headers.end()) return std::string();
  const std::string& link = it->second;
  for (size_t at = 0; at < link.size();) {
    const size_t open = link.find('<', at), close = link.find('>', open);
    if (open == std::string::npos || close == std::string::npos) break;
    const size_t end = std::min(link.find(',', close), link.size());
    if (link.substr(close, end - close).find("rel=\"next\"") != std::string::npos) {
      std::string next = link.substr(open + 1, close - open - 1);
      if (next.rfind(o.endpoint + "/", 0) != 0) {
        return data_loss("the hub's file list continues at " + printable(next) + ", not on " +
                         o.endpoint);
      }
      return next;
    }
    at = end + 1;
  }
  return std::string();
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
  for (int page = 0; !url.empty(); ++page) {
    if (page == kMaxTreePages)
      return data_loss("the hub's file list of " + repo_id + " never ends");
    HttpResult r = client.get(url);
    if (r.status != 200) {
      *failed = r;
      return hub_error(r, repo_id, "revision " + commit, o);
    }
    VLM_ASSIGN_OR_RETURN(std::vector<RepoFile> more, parse_tree_page(r.body, url));
    files.insert(files.end(), more.begin(), more.end());
    VLM_ASSIGN_OR_RETURN(url, next_page(r, o));
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

// The hub did not give the revision: the cached snapshot, with a note, as huggingface_hub falls
// back on any failed request but an unknown revision; else the hub's error (with the cache's
// word when the hub gave no answer or a server error). A malformed answer is an error as it is.
Result<LocalModel> unreachable(const ModelName& name, const HubOptions& o, const fs::path& repo_dir,
                               const HttpResult& failed, const Status& error) {
  const auto code = failed.headers.find("x-error-code");
  const bool no_answer = failed.status == 0 && !failed.transport_error.empty();
  if ((failed.status == 0 && !no_answer) ||
      (code != failed.headers.end() && code->second == "RevisionNotFound")) {
    return error;
  }
  auto cached = from_cache(name, o, repo_dir, error.message());
  if (!cached.ok()) return no_answer || failed.status >= 500 ? cached.status() : error;
  if (o.progress != Progress::kQuiet) {
    log(LogLevel::kWarn,
        error.message() + "; using the cached " + name.repo_id + " (" + cached->commit + ")");
  }
  return cached;
}

// Cache bookkeeping that may fail (a read-only shared cache) without stopping a run.
void warn_if(const Status& st, const HubOptions& o) {
  if (!st.ok() && o.progress != Progress::kQuiet) log(LogLevel::kWarn, st.message());
}

struct Fetched {
  int files = 0;
  int64_t bytes = 0;
};

// Links the wanted files whose blobs are here; downloads the others, each blob once, then links
// the files that share it.
Result<Fetched> fetch_missing(const std::vector<RepoFile>& tree, const Selection& sel,
                              const fs::path& repo_dir, const ModelName& name,
                              const std::string& commit, const HubOptions& o) {
  std::vector<RepoFile> fetch, link_after;
  std::error_code ec;
  for (const RepoFile& f : tree) {
    if (std::find(sel.files.begin(), sel.files.end(), f.path) == sel.files.end()) continue;
    if (fs::exists(repo_dir / "snapshots" / commit / f.path, ec)) continue;
    const bool fetching = std::any_of(fetch.begin(), fetch.end(),
                                      [&](const RepoFile& g) { return g.etag() == f.etag(); });
    if (fs::exists(repo_dir / "blobs" / f.etag(), ec)) {
      VLM_RETURN_IF_ERROR(link_snapshot_file(repo_dir, commit, f.path, f.etag()));
    } else if (fetching) {
      link_after.push_back(f);
    } else {
      fetch.push_back(f);
    }
  }
  if (fetch.empty()) return Fetched{};
  Downloader d(o, repo_dir, name.repo_id, commit);
  VLM_RETURN_IF_ERROR(d.run(fetch));
  for (const RepoFile& f : link_after) {
    VLM_RETURN_IF_ERROR(link_snapshot_file(repo_dir, commit, f.path, f.etag()));
  }
  return Fetched{static_cast<int>(fetch.size()), d.bytes_downloaded()};
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
    warn_if(write_tree_cache(repo_dir, commit, *tree), o);
  }
  VLM_ASSIGN_OR_RETURN(Selection sel,
                       select_files(paths_of(*tree), name.quant, name.repo_id, o.weights));
  tag_cache_dir(o.cache_dir);
  VLM_ASSIGN_OR_RETURN(Fetched got, fetch_missing(*tree, sel, repo_dir, name, commit, o));
  if (!is_commit_hash(name.revision)) warn_if(write_ref(repo_dir, name.revision, commit), o);
  LocalModel m = local_model(repo_dir, name.repo_id, commit, sel);
  m.files_downloaded = got.files;
  m.bytes_downloaded = got.bytes;
  return m;
}

}  // namespace vlm::hub
