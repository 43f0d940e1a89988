#include "tune_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "vlm/log.h"

namespace vlm_cli {

std::string data_path(const std::string& installed_rel, const std::string& checkout_path,
                      const std::string& marker) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return checkout_path;
  const fs::path installed = (exe.parent_path() / installed_rel).lexically_normal();
  if (fs::exists(marker.empty() ? installed : installed / marker, ec)) return installed.string();
  if (fs::equivalent(exe.parent_path(), VLM_BUILD_BIN_DIR, ec)) return checkout_path;
  return installed.string();  // not there: the caller's error names it
}

int run_tune(int argc, char** argv) {
  namespace fs = std::filesystem;
  const std::string script =
      data_path(std::string(VLM_INSTALLED_DATA_REL) + "/scripts/tune_serve.py",
                std::string(VLM_SOURCE_DIR) + "/scripts/tune_serve.py");
  std::error_code ec;
  if (!fs::exists(script, ec)) {
    vlm::log(vlm::LogLevel::kError, "vlm tune: the tuner is not at " + script);
    return 1;
  }
  const char* env = std::getenv("VLM_PYTHON");
  const std::string python = env != nullptr && *env != '\0' ? env : "python3";
  std::vector<std::string> args = {python, script};
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {  // first: a --vlm among the user's arguments wins
    args.push_back("--vlm");
    args.push_back(self.string());
  }
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execvp(python.c_str(), cargs.data());
  vlm::log(vlm::LogLevel::kError, "vlm tune: cannot run " + python + " (" + std::strerror(errno) +
                                      "); set VLM_PYTHON to a Python 3 (one executable's path) "
                                      "with the packages of requirements-bench.txt beside " +
                                      script);
  return 1;
}

}  // namespace vlm_cli
