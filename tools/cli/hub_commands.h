// Models by name on the command line: -m ORG/NAME[@REVISION][:QUANT] wherever a model is taken,
// --hf-token, and the cache's commands (vlm pull, vlm ls, vlm rm).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "vlm/status.h"

namespace vlm_cli {

inline constexpr const char* kModelNameHelp =
    " or a Hugging Face model name ORG/NAME[@REVISION][:QUANT] (found in the Hugging Face cache, "
    "downloaded there when missing; :QUANT picks a GGUF repository's file)";

// --hf-token: the token for gated and private models (default: HF_TOKEN, else $HF_HOME/token).
void add_hf_token_option(CLI::App* app, std::string* token);

// A model argument that names a model (and no file or folder of that name exists) becomes its
// files in the cache; `mmproj` (may be null) gets a GGUF repository's vision file when empty.
// A path passes through unchanged. `weights` false: a safetensors checkpoint's files but its
// weights (what a tokenizer needs).
vlm::Status resolve_model(std::string* model, std::string* mmproj, const std::string& token,
                          bool weights = true);

struct HubArgs {
  std::string name;
  std::string token;
  bool json = false;
  CLI::App* pull = nullptr;
  CLI::App* ls = nullptr;
  CLI::App* rm = nullptr;
};

// pull, ls and rm.
void add_hub_commands(CLI::App* app, HubArgs* a);
// Runs the one parsed (-1: none of them was).
int run_hub_command(const HubArgs& a);

}  // namespace vlm_cli
