// vlm pull / ls / rm, and -m NAME resolved through the Hugging Face cache.
#include "hub_commands.h"

#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "vlm/hub.h"
#include "vlm/log.h"
#include "vlm/progress.h"

namespace vlm_cli {
namespace {

int fail(const vlm::Status& s) {
  vlm::log(vlm::LogLevel::kError, s.message());
  return 1;
}

std::string when(int64_t t) {
  if (t <= 0) return "-";
  const std::time_t tt = static_cast<std::time_t>(t);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

int cmd_pull(const HubArgs& a) {
  auto name = vlm::hub::parse_model_name(a.name);
  if (!name.ok()) return fail(name.status());
  vlm::hub::HubOptions o = vlm::hub::options_from_env(a.token);
  auto m = vlm::hub::resolve(*name, o);
  if (!m.ok()) return fail(m.status());
  if (vlm::log_enabled(vlm::LogLevel::kInfo)) {  // not --quiet
    const int n = m->files_downloaded;
    const std::string what = n == 0 ? "already in the cache"
                                    : "downloaded " + std::to_string(n) +
                                          (n == 1 ? " file, " : " files, ") +
                                          vlm::human_bytes(m->bytes_downloaded);
    vlm::log_printf(vlm::LogLevel::kInfo, "%s at %s: %s", name->str().c_str(), m->commit.c_str(),
                    what.c_str());
    if (!m->mmproj.empty())
      vlm::log_printf(vlm::LogLevel::kInfo, "vision file %s", m->mmproj.c_str());
  }
  std::printf("%s\n", m->path.c_str());
  return 0;
}

nlohmann::json ls_json(const std::vector<vlm::hub::CachedModel>& models) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : models) {
    nlohmann::json revs = nlohmann::json::array();
    for (const auto& r : m.revisions) {
      revs.push_back({{"commit", r.commit},
                      {"refs", r.refs},
                      {"path", r.path},
                      {"files", r.files},
                      {"size", r.size}});
    }
    out.push_back({{"name", m.name},
                   {"path", m.path},
                   {"size", m.size},
                   {"modified", m.modified},
                   {"revisions", revs}});
  }
  return out;
}

int cmd_ls(const HubArgs& a) {
  const vlm::hub::HubOptions o = vlm::hub::options_from_env();
  auto models = vlm::hub::list_cached(o);
  if (!models.ok()) return fail(models.status());
  if (a.json) {
    std::printf("%s\n", ls_json(*models).dump(1).c_str());
    return 0;
  }
  std::printf("%-48s %-24s %10s  %s\n", "NAME", "REVISIONS", "SIZE", "MODIFIED");
  for (const auto& m : *models) {
    std::string revs;
    for (const auto& r : m.revisions) {
      std::string refs;
      for (const auto& ref : r.refs) refs += (refs.empty() ? "" : ",") + ref;
      revs += (revs.empty() ? "" : " ") + r.commit.substr(0, 8) +
              (refs.empty() ? "" : "(" + refs + ")");
    }
    std::printf("%-48s %-24s %10s  %s\n", m.name.c_str(), revs.c_str(),
                vlm::human_bytes(m.size).c_str(), when(m.modified).c_str());
  }
  if (models->empty())
    vlm::log_printf(vlm::LogLevel::kInfo, "no models in %s", o.cache_dir.c_str());
  return 0;
}

int cmd_rm(const HubArgs& a) {
  auto name = vlm::hub::parse_model_name(a.name);
  if (!name.ok()) return fail(name.status());
  if (!name->quant.empty()) {
    return fail(vlm::invalid_argument(
        "vlm rm removes a model or one revision of it (ORG/NAME[@REVISION]), not one GGUF file: "
        "drop ':" +
        name->quant + "'"));
  }
  const vlm::hub::HubOptions o = vlm::hub::options_from_env();
  auto freed = vlm::hub::remove_cached(*name, o);
  if (!freed.ok()) return fail(freed.status());
  vlm::log_printf(vlm::LogLevel::kInfo, "removed %s from %s (%s freed)", name->str().c_str(),
                  o.cache_dir.c_str(), vlm::human_bytes(*freed).c_str());
  return 0;
}

}  // namespace

void add_hf_token_option(CLI::App* app, std::string* token) {
  app->add_option("--hf-token", *token,
                  "Hugging Face token for gated and private models (default: HF_TOKEN, else the "
                  "file HF_TOKEN_PATH or $HF_HOME/token)");
}

vlm::Status resolve_model(std::string* model, std::string* mmproj, const std::string& token,
                          bool weights) {
  if (!vlm::hub::is_model_name(*model)) return vlm::ok_status();
  VLM_ASSIGN_OR_RETURN(vlm::hub::ModelName name, vlm::hub::parse_model_name(*model));
  vlm::hub::HubOptions o = vlm::hub::options_from_env(token);
  o.weights = weights;
  auto m = vlm::hub::resolve(name, o);
  if (!m.ok()) {
    return m.status().with_context("-m " + *model +
                                   " (no file or folder of that name; as a "
                                   "Hugging Face model)");
  }
  *model = m->path;
  if (mmproj != nullptr && mmproj->empty()) *mmproj = m->mmproj;
  return vlm::ok_status();
}

void add_hub_commands(CLI::App* app, HubArgs* a) {
  a->pull = app->add_subcommand(
      "pull",
      "Download a model into the Hugging Face cache (or check it is whole); prints its path");
  a->pull->add_option("name", a->name, "ORG/NAME[@REVISION][:QUANT]")->required();
  add_hf_token_option(a->pull, &a->token);
  a->ls = app->add_subcommand("ls", "List the models in the Hugging Face cache");
  a->ls->add_flag("--json", a->json, "As JSON: names, revisions, refs, paths, files and bytes");
  a->rm = app->add_subcommand(
      "rm", "Remove a model from the Hugging Face cache (NAME@REVISION: that revision only)");
  a->rm->add_option("name", a->name, "ORG/NAME[@REVISION]")->required();
}

int run_hub_command(const HubArgs& a) {
  if (a.pull && *a.pull) return cmd_pull(a);
  if (a.ls && *a.ls) return cmd_ls(a);
  if (a.rm && *a.rm) return cmd_rm(a);
  return -1;
}

}  // namespace vlm_cli
