// What a server does with its model (vlm/server.h: ServeTask): --task's names, and what a
// checkpoint's files say.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "vlm/server.h"

namespace vlm {

const char* serve_task_name(ServeTask t) {
  switch (t) {
    case ServeTask::kAuto:
      return "auto";
    case ServeTask::kGenerate:
      return "generate";
    case ServeTask::kEmbed:
      return "embed";
    case ServeTask::kRerank:
      return "rerank";
  }
  return "?";
}

Result<ServeTask> parse_serve_task(std::string_view name) {
  for (ServeTask t :
       {ServeTask::kAuto, ServeTask::kGenerate, ServeTask::kEmbed, ServeTask::kRerank}) {
    if (name == serve_task_name(t)) return t;
  }
  return invalid_argument("--task must be auto, generate, embed or rerank, not '" +
                          std::string(name) + "'");
}

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A JSON file of the checkpoint, or null when it is absent; an error when it does not parse.
Result<json> read_json_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return json();
  std::ifstream f(p);
  json j = json::parse(f, nullptr, false);
  if (j.is_discarded()) return invalid_argument(p.string() + " is not valid JSON");
  return j;
}

// obj[key] when it is a string, else "" (whatever the file holds there: never a throw).
std::string string_at(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool true_at(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

Result<ServeTask> detect_serve_task(const std::string& model_dir) {
  std::error_code ec;
  const fs::path dir(model_dir);
  if (!fs::is_directory(dir, ec)) return ServeTask::kGenerate;  // a GGUF file says nothing
  // sentence-transformers: modules.json lists a Pooling module, whose config names its mode.
  VLM_ASSIGN_OR_RETURN(json modules, read_json_file(dir / "modules.json"));
  if (modules.is_array()) {
    for (const json& m : modules) {
      if (!m.is_object() || !string_at(m, "type").ends_with("models.Pooling")) continue;
      const fs::path cfg = dir / string_at(m, "path") / "config.json";
      VLM_ASSIGN_OR_RETURN(json pool, read_json_file(cfg));
      if (!pool.is_object()) {
        return not_found(cfg.string() +
                         ": the pooling module's config is missing (modules.json names it)");
      }
      if (true_at(pool, "pooling_mode_lasttoken")) return ServeTask::kEmbed;
      std::string modes;
      for (const auto& [k, v] : pool.items()) {
        if (k.starts_with("pooling_mode_") && true_at(pool, k)) modes += " " + k;
      }
      return invalid_argument(cfg.string() + ": the checkpoint pools by" +
                              (modes.empty() ? std::string(" no mode") : modes) +
                              "; vlm pools the last token (pooling_mode_lasttoken), as "
                              "Qwen3-VL-Embedding does");
    }
  }
  VLM_ASSIGN_OR_RETURN(json config, read_json_file(dir / "config.json"));
  auto arch = config.is_object() ? config.find("architectures") : config.end();
  if (config.is_object() && arch != config.end() && arch->is_array()) {
    for (const json& a : *arch) {
      if (!a.is_string() || !a.get<std::string>().ends_with("ForSequenceClassification")) continue;
      auto tokens = config.find("classifier_from_token");
      if (tokens != config.end() && *tokens == json::array({"no", "yes"}))
        return ServeTask::kRerank;
    }
  }
  return ServeTask::kGenerate;
}

}  // namespace vlm
