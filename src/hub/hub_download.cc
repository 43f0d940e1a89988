// Downloading a revision's missing files into the cache: several at once, each into
// blobs/<etag>.incomplete under its lock in .locks/, resumed with Range requests (after a cut
// connection, or a run stopped earlier), checked against the hub's hash, then renamed and linked.
#include "hub/hub_download.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "vlm/log.h"
#include "vlm/progress.h"

namespace vlm::hub {
namespace {

constexpr int kMaxAttempts = 6;

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

int64_t file_size_or_zero(const fs::path& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  return st.st_size;
}

// Feeds the first `n` bytes of `path` to `hash` (a resumed download's bytes so far).
Status hash_prefix(const fs::path& path, int64_t n, ContentHash* hash) {
  Fd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.fd < 0) return unavailable("cannot read " + path.string() + ": " + std::strerror(errno));
  std::vector<char> buf(1 << 20);
  while (n > 0) {
    const ssize_t r = ::read(in.fd, buf.data(), std::min<int64_t>(n, buf.size()));
    if (r <= 0) return unavailable("cannot read " + path.string());
    hash->update(buf.data(), static_cast<size_t>(r));
    n -= r;
  }
  return ok_status();
}

}  // namespace

// ---- Progress ----

Meter::Meter(const HubOptions& o, std::string repo_id) : log_(o.log), repo_(std::move(repo_id)) {
  mode_ = o.progress;
  if (mode_ == Progress::kAuto) {  // a bar on a terminal, unless the log is JSON or info is off
    const bool bar = ::isatty(::fileno(log_)) && log_format() == LogFormat::kText &&
                     log_enabled(LogLevel::kInfo);
    mode_ = bar ? Progress::kBar : Progress::kLines;
  }
}

Meter::~Meter() { finish(); }

void Meter::start(int files, int64_t total, int64_t have) {
  files_ = files;
  total_ = total;
  done_ = have;
  first_done_ = have;
  t0_ = std::chrono::steady_clock::now();
  if (mode_ == Progress::kLines) {
    line("downloading " + std::to_string(files) + " file" + (files == 1 ? "" : "s") + ", " +
         human_bytes(total) + (have > 0 ? " (" + human_bytes(have) + " already here)" : ""));
  }
  if (mode_ == Progress::kBar) {
    drawer_ = std::thread([this] {
      std::unique_lock<std::mutex> lk(mu_);
      while (!stop_) {
        draw_locked();
        cv_.wait_for(lk, std::chrono::milliseconds(200));
      }
    });
  }
}

void Meter::add(int64_t n) { done_ += n; }

void Meter::file_done(const std::string& path, int64_t size) {
  ++files_done_;
  if (mode_ == Progress::kLines) line(path + " (" + human_bytes(size) + ") downloaded");
}

void Meter::note(const std::string& text) {
  if (mode_ == Progress::kQuiet) return;
  line(text);
}

void Meter::line(const std::string& text) {
  std::lock_guard<std::mutex> lk(mu_);
  if (mode_ == Progress::kBar) {  // over the bar, which the next tick redraws below
    std::fprintf(log_, "\r\x1b[Kvlm: %s: %s\n", repo_.c_str(), text.c_str());
    std::fflush(log_);
    return;
  }
  vlm::log(LogLevel::kInfo, repo_ + ": " + text);
}

void Meter::draw_locked() {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const int64_t done = done_.load();
  const int pct =
      total_ > 0 ? std::clamp(static_cast<int>(100.0 * static_cast<double>(done) / total_), 0, 100)
                 : 100;
  const int64_t rate =
      secs > 0.2 ? std::max<int64_t>(0, static_cast<int64_t>((done - first_done_) / secs)) : 0;
  constexpr int kWidth = 24;
  std::string bar(kWidth, ' ');
  for (int i = 0; i < kWidth * pct / 100; ++i) bar[i] = '#';
  std::fprintf(log_, "\r\x1b[Kvlm: %s [%s] %3d%% %s / %s, %s/s, %d of %d files", repo_.c_str(),
               bar.c_str(), pct, human_bytes(done).c_str(), human_bytes(total_).c_str(),
               human_bytes(rate).c_str(), files_done_.load(), files_);
  std::fflush(log_);
}

void Meter::finish() {
  if (!drawer_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    draw_locked();
    std::fputc('\n', log_);
  }
  cv_.notify_all();
  drawer_.join();
}

// ---- One file ----

Status Downloader::fetch(HttpClient& client, const RepoFile& f) {
  const std::string etag = f.etag();
  const fs::path blob = repo_dir_ / "blobs" / etag;
  std::error_code ec;
  if (!fs::exists(blob, ec)) {
    const fs::path lock_path =
        fs::path(o_.cache_dir) / ".locks" / repo_folder_name(repo_id_) / (etag + ".lock");
    fs::create_directories(lock_path.parent_path(), ec);
    // 0664 as huggingface_hub's filelock makes them (the umask applies): a shared cache's lock.
    Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0664));
    if (lock.fd < 0 || ::flock(lock.fd, LOCK_EX) != 0) {
      return unavailable("cannot lock " + lock_path.string() + ": " + std::strerror(errno));
    }
    if (!fs::exists(blob, ec)) {
      Status st = download_blob(client, f, blob);
      if (!st.ok()) {
        // A refusal before any byte (a gated file, say) leaves no empty partial file behind.
        const fs::path part = blob.string() + ".incomplete";
        if (fs::is_regular_file(part, ec) && fs::file_size(part, ec) == 0) fs::remove(part, ec);
        return st;
      }
    }
  }
  VLM_RETURN_IF_ERROR(link_snapshot_file(repo_dir_, commit_, f.path, etag));
  meter_.file_done(f.path, f.size);
  return ok_status();
}

Status Downloader::download_blob(HttpClient& client, const RepoFile& f, const fs::path& blob) {
  const fs::path part = blob.string() + ".incomplete";
  Fd out(::open(part.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (out.fd < 0) return unavailable("cannot write " + part.string() + ": " + std::strerror(errno));
  int64_t have = file_size_or_zero(part);
  if (have > f.size) {  // not this file's start: over again (check_space counted f.size of it)
    if (::ftruncate(out.fd, 0) != 0) return write_error(f, part, 0, errno);
    meter_.add(-f.size);
    have = 0;
  }
  const auto kind = f.lfs_sha256.empty() ? ContentHash::Kind::kGitSha1 : ContentHash::Kind::kSha256;
  ContentHash hash(kind, f.size);
  if (have > 0) {
    VLM_RETURN_IF_ERROR(hash_prefix(part, have, &hash));
    meter_.note(f.path + ": resuming at " + human_bytes(have) + " of " + human_bytes(f.size));
  }
  const std::string url = o_.endpoint + "/" + repo_id_ + "/resolve/" + commit_ + "/" +
                          url_quote(f.path, /*safe_slash=*/true);
  auto sink = [&](const void* p, size_t n) {
    hash.update(p, n);
    have += static_cast<int64_t>(n);
    meter_.add(static_cast<int64_t>(n));
  };
  auto restart = [&] {
    hash = ContentHash(kind, f.size);
    meter_.add(-have);
    have = 0;
  };
  bool started_over = false;
  for (int attempt = 1;; ++attempt) {
    auto d = client.download(url, out.fd, have, f.size, sink, restart, &cancel_);
    if (d.cancelled) return unavailable("cancelled");
    if (d.write_errno != 0) return write_error(f, part, have, d.write_errno);
    if (d.overflow) {
      std::error_code ec;
      fs::remove(part, ec);
      return data_loss(f.path + " of " + repo_id_ + ": the server sent more than the " +
                       std::to_string(f.size) + " bytes the hub lists; the download was discarded");
    }
    const HttpResult& r = d.result;
    const bool cut = !r.transport_error.empty();
    if (r.status >= 200 && r.status < 300 && have == f.size) break;
    if (!cut && r.status == 416) {  // the Range starts at or past the end
      if (have == f.size) break;
      if (started_over || ::ftruncate(out.fd, 0) != 0)
        return hub_error(r, repo_id_, "file " + f.path, o_);
      meter_.note(f.path + ": the partial file does not fit the hub's; starting over");
      restart();
      started_over = true;
      continue;
    }
    if (!cut && r.status >= 300 && r.status < 500 && r.status != 429) {
      return hub_error(r, repo_id_, "file " + f.path, o_);
    }
    // Cut, stalled, a server error, rate-limited, or an answer that ended early: resume.
    const std::string why = cut              ? "connection cut (" + r.transport_error + ")"
                            : r.status < 300 ? std::string("the answer ended early")
                                             : "HTTP " + std::to_string(r.status);
    const std::string at = " at " + human_bytes(have) + " of " + human_bytes(f.size);
    if (attempt == kMaxAttempts || cancel_) {
      return unavailable(f.path + " of " + repo_id_ + ": " + why + at + " after " +
                         std::to_string(attempt) +
                         " tries; the partial file is kept: run again to resume");
    }
    meter_.note(f.path + ": " + why + at + ", resuming (try " + std::to_string(attempt + 1) +
                " of " + std::to_string(kMaxAttempts) + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(250 << std::min(attempt, 5)));
  }
  return finish_blob(f, part, blob, have, hash.hex());
}

Status Downloader::finish_blob(const RepoFile& f, const fs::path& part, const fs::path& blob,
                               int64_t have, const std::string& digest) {
  std::error_code ec;
  if (have != f.size) {
    fs::remove(part, ec);
    return data_loss("size mismatch: " + f.path + " of " + repo_id_ + " downloaded as " +
                     std::to_string(have) + " bytes where the hub lists " + std::to_string(f.size) +
                     "; the download was discarded (run again)");
  }
  if (digest != f.etag()) {
    fs::remove(part, ec);
    return data_loss("checksum mismatch: " + f.path + " of " + repo_id_ + " downloaded with " +
                     (f.lfs_sha256.empty() ? "git SHA-1 " : "SHA-256 ") + digest +
                     " where the hub lists " + f.etag() +
                     "; the download was discarded (run again to fetch it anew)");
  }
  fs::rename(part, blob, ec);
  if (ec) return unavailable("cannot rename " + part.string() + ": " + ec.message());
  return ok_status();
}

Status Downloader::write_error(const RepoFile& f, const fs::path& part, int64_t have, int err) {
  const std::string where = part.parent_path().string();
  if (err == ENOSPC || err == EDQUOT) {
    return unavailable("no space left on the device writing " + f.path + " of " + repo_id_ +
                       " into " + where + " (" + human_bytes(have) + " of " + human_bytes(f.size) +
                       " written and kept: free space, then run again and it resumes there)");
  }
  return unavailable("cannot write " + part.string() + ": " + std::strerror(err));
}

// ---- Many files ----

Status Downloader::check_space(const std::vector<RepoFile>& jobs, int64_t* need, int64_t* have) {
  const fs::path blobs = repo_dir_ / "blobs";
  std::error_code ec;
  fs::create_directories(blobs, ec);
  if (ec) return unavailable("cannot create " + blobs.string() + ": " + ec.message());
  *need = 0;
  *have = 0;
  for (const RepoFile& f : jobs) {
    const int64_t part = std::min(f.size, file_size_or_zero(blobs / (f.etag() + ".incomplete")));
    *have += part;
    *need += f.size - part;
  }
  struct statvfs st;
  if (::statvfs(blobs.c_str(), &st) != 0) return ok_status();
  const auto free_bytes = static_cast<long double>(st.f_bavail) * st.f_frsize;
  if (static_cast<long double>(*need) > free_bytes) {
    return unavailable("not enough disk space for " + repo_id_ + ": its files need " +
                       human_bytes(*need) + " more, and " +
                       human_bytes(static_cast<int64_t>(free_bytes)) + " are free in " +
                       blobs.string() + " (set HF_HUB_CACHE to a larger disk)");
  }
  return ok_status();
}

Status Downloader::run(const std::vector<RepoFile>& jobs) {
  int64_t need = 0, have = 0;
  VLM_RETURN_IF_ERROR(check_space(jobs, &need, &have));
  meter_.start(static_cast<int>(jobs.size()), need + have, have);
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto worker = [&] {
    HttpClient client(o_);
    for (size_t i = next++; i < jobs.size() && !cancel_; i = next++) {
      Status st = fetch(client, jobs[i]);
      if (st.ok()) continue;
      std::lock_guard<std::mutex> lk(mu);
      if (first_error.ok() && !cancel_) first_error = st;
      cancel_ = true;
    }
  };
  const int n = std::max(1, std::min<int>(o_.max_workers, static_cast<int>(jobs.size())));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  meter_.finish();
  bytes_ = meter_.done() - have;
  return first_error;
}

}  // namespace vlm::hub
