// vlm serve --config FILE.yaml, read by yaml-cpp (Debian's libyaml-cpp-dev) and applied to the
// subcommand's options as CLI11 applies its own configuration files (which it reads for the
// top-level command only).
#include "config_file.h"

#include <yaml-cpp/yaml.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace vlm_cli {
namespace {

std::vector<std::string> values(const std::string& key, const YAML::Node& v) {
  if (v.IsScalar()) return {v.Scalar()};
  if (v.IsSequence()) {
    std::vector<std::string> out;
    for (const auto& e : v) {
      if (!e.IsScalar()) throw std::invalid_argument(key + ": a list of plain values only");
      out.push_back(e.Scalar());
    }
    return out;
  }
  throw std::invalid_argument(key + ": a value, or a list of them (not " +
                              std::string(v.IsNull() ? "empty" : "a mapping") + ")");
}

// One key: the option it names, given the file's values unless the command line gave it; a
// second key for one option (max_num_seqs and max-num-seqs) is refused.
void apply_key(CLI::App* app, const YAML::Node& key, const YAML::Node& value,
               std::set<std::string>* seen) {
  if (!key.IsScalar()) throw std::invalid_argument("a key is not a name");
  std::string name = key.Scalar();
  for (char& c : name) c = c == '_' ? '-' : c;
  CLI::Option* op = app->get_option_no_throw("--" + name);
  if (op == nullptr || !op->get_configurable() || name == "config" || name == "help" ||
      name == "help-all") {
    throw std::invalid_argument("unknown key '" + key.Scalar() + "': keys are `vlm " +
                                app->get_name() +
                                "`'s long option names (port, max-num-seqs, ...)");
  }
  std::vector<std::string> in = values(key.Scalar(), value);
  if (!seen->insert(name).second) throw std::invalid_argument(name + " is given twice");
  if (op->count() > 0) return;        // the command line wins
  if (op->get_expected_min() == 0) {  // a flag: true / false, negated flags turned as CLI11 does
    if (in.size() != 1) throw std::invalid_argument(key.Scalar() + ": a flag takes true or false");
    op->add_result(op->get_flag_value(name, in[0]));  // CLI11 keeps flag names undashed
  } else {
    for (const std::string& v : in) op->add_result(v);
  }
  op->run_callback();
}

}  // namespace

void add_config_option(CLI::App* app, std::string* path) {
  app->add_option("--config", *path,
                  "YAML file of options (keys: the long option names, e.g. port: 8080); an option "
                  "on the command line wins");
}

vlm::Status apply_config(CLI::App* app, const std::string& path) {
  if (path.empty()) return vlm::ok_status();
  const std::string where = "--config " + path + ": ";
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return vlm::not_found(where + "cannot read the file");
  } catch (const YAML::Exception& e) {
    return vlm::invalid_argument(where + "not YAML: " + e.what());
  }
  if (root.IsNull()) return vlm::ok_status();
  if (!root.IsMap()) return vlm::invalid_argument(where + "not a mapping of option: value");
  std::set<std::string> seen;
  for (const auto& kv : root) {
    try {
      apply_key(app, kv.first, kv.second, &seen);
    } catch (const std::invalid_argument& e) {
      return vlm::invalid_argument(where + e.what());
    } catch (const CLI::Error& e) {  // a value the option refuses
      return vlm::invalid_argument(where + kv.first.Scalar() + ": " + e.what());
    }
  }
  return vlm::ok_status();
}

}  // namespace vlm_cli
