#include "server/router_api.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace vlm {
namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

}  // namespace

void read_model_config(const std::string& model_dir, ReplicaInfo* info) {
  std::ifstream f(model_dir + "/config.json");
  const ojson j = ojson::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) info->model_type = *it;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    for (const ojson& a : *it) {
      if (a.is_string()) info->architectures.push_back(a.get<std::string>());
    }
  }
}

std::string server_info_json(const ReplicaInfo& info) {
  ojson j;
  j["model_path"] = info.model_path;
  j["served_model_name"] = info.served_model_name;
  j["tp_size"] = 1;
  j["dp_size"] = 1;
  j["pp_size"] = 1;
  j["disaggregation_mode"] = "null";
  j["version"] = info.version;
  j["is_embedding"] = false;
  j["context_length"] = info.context_length;
  j["max_total_tokens"] = info.max_total_tokens;
  j["max_running_requests"] = info.max_running_requests;
  return dump(j);
}

std::string model_info_json(const ReplicaInfo& info) {
  ojson j;
  j["model_path"] = info.model_path;
  j["tokenizer_path"] = info.model_path;
  j["is_generation"] = true;
  j["has_image_understanding"] = info.has_vision;
  j["has_audio_understanding"] = false;
  j["model_type"] = info.model_type;
  j["architectures"] = info.architectures;
  return dump(j);
}

std::string loads_json(const ReplicaInfo& info, const ReplicaLoad& load,
                       const std::string& timestamp) {
  ojson rank;
  rank["dp_rank"] = 0;
  rank["num_running_reqs"] = load.running;
  rank["num_waiting_reqs"] = load.waiting;
  rank["num_total_reqs"] = load.running + load.waiting;
  rank["num_used_tokens"] = load.used_tokens;
  rank["max_total_num_tokens"] = info.max_total_tokens;
  rank["token_usage"] = info.max_total_tokens > 0 ? static_cast<double>(load.used_tokens) /
                                                        static_cast<double>(info.max_total_tokens)
                                                  : 0.0;
  rank["gen_throughput"] = load.gen_throughput;
  rank["cache_hit_rate"] = load.cache_hit_rate;
  rank["utilization"] =
      info.max_running_requests > 0
          ? static_cast<double>(load.running) / static_cast<double>(info.max_running_requests)
          : 0.0;
  rank["max_running_requests"] = info.max_running_requests;
  ojson j;
  j["timestamp"] = timestamp;
  j["version"] = info.version;
  j["dp_rank_count"] = 1;
  j["loads"] = ojson::array({rank});
  return dump(j);
}

}  // namespace vlm
