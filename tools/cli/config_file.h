// `vlm serve --config FILE.yaml`: the options from a YAML file, as vLLM's --config takes them.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "vlm/status.h"

namespace vlm_cli {

// Adds --config FILE to `app` (vlm serve), into `path`.
void add_config_option(CLI::App* app, std::string* path);

// After the command line is parsed: the file's options, those the command line did not give.
// The file is a YAML mapping whose keys are the command's long option names without the dashes
// (`port: 8080`, `max-num-seqs: 16`; '_' may stand for '-'), its values scalars or, for options
// taking several, lists; a flag takes true or false. A key that is no option of the command, a
// nested value, a value the option refuses or a file that is not YAML is an error naming it.
vlm::Status apply_config(CLI::App* app, const std::string& path);

}  // namespace vlm_cli
