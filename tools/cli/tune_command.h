// `vlm tune`: the serving tuner (scripts/tune_serve.py), run by Python with this binary as the
// server it starts.
#pragma once

#include <string>

namespace vlm_cli {

// Replaces this process with `PYTHON TUNER --vlm THIS_BINARY ARGS...` (a --vlm in ARGS wins):
// PYTHON is $VLM_PYTHON or python3 (from PATH); TUNER is tune_serve.py beside an installed binary
// (PREFIX/share/vlm/scripts) or, for the binary in its build folder, the checkout's scripts/.
// Returns only on failure: the exit code, with the reason said.
int run_tune(int argc, char** argv);

// A file or folder the binary reads: `installed_rel` (relative to the binary's folder, e.g.
// ../share/vlm/scripts/tune_serve.py) where `installed_rel/marker` exists; for the binary in its
// build folder, `checkout_path`; else the installed path (missing: for an error to name).
std::string data_path(const std::string& installed_rel, const std::string& checkout_path,
                      const std::string& marker = "");

}  // namespace vlm_cli
