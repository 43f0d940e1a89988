// Downloading a revision's files into the cache (hub_download.cc) and the progress it shows.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hub/hub_internal.h"

namespace vlm::hub {

// Progress: on a terminal one bar redrawn in place (bytes, percent, rate, files); elsewhere one
// plain line when the download starts and one per file done. Notes (resumes, retries) are lines.
class Meter {
 public:
  Meter(const HubOptions& o, std::string repo_id);
  ~Meter();
  Meter(const Meter&) = delete;
  Meter& operator=(const Meter&) = delete;

  void start(int files, int64_t total, int64_t have);
  void add(int64_t n);
  void file_done(const std::string& path, int64_t size);
  void note(const std::string& text);
  void finish();
  int64_t done() const { return done_.load(); }

 private:
  void line(const std::string& text);
  void draw_locked();

  std::FILE* log_;
  std::string repo_;
  Progress mode_;
  int files_ = 0;
  int64_t total_ = 0;
  int64_t first_done_ = 0;
  std::atomic<int64_t> done_{0};
  std::atomic<int> files_done_{0};
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread drawer_;
};

// The files of one revision, fetched by up to HubOptions::max_workers threads; the first error
// stops the others (their partial files stay, to be resumed).
class Downloader {
 public:
  Downloader(const HubOptions& o, fs::path repo_dir, std::string repo_id, std::string commit)
      : o_(o),
        repo_dir_(std::move(repo_dir)),
        repo_id_(std::move(repo_id)),
        commit_(std::move(commit)),
        meter_(o, repo_id_) {}

  // Refused before any request when the disk cannot hold what is missing.
  Status run(const std::vector<RepoFile>& jobs);
  int64_t bytes_downloaded() const { return bytes_; }

 private:
  Status fetch(HttpClient& client, const RepoFile& f);
  Status download_blob(HttpClient& client, const RepoFile& f, const fs::path& blob);
  Status finish_blob(const RepoFile& f, const fs::path& part, const fs::path& blob, int64_t have,
                     const std::string& digest);
  Status write_error(const RepoFile& f, const fs::path& part, int64_t have, int err);
  Status check_space(const std::vector<RepoFile>& jobs, int64_t* need, int64_t* have);

  const HubOptions& o_;
  fs::path repo_dir_;
  std::string repo_id_;
  std::string commit_;
  Meter meter_;
  std::atomic<bool> cancel_{false};
  int64_t bytes_ = 0;
};

}  // namespace vlm::hub
