// Which files of a repository vlm needs: a safetensors checkpoint's, or one GGUF quantization and
// its vision file (the rules of llama.cpp's -hf, written here from its documented behaviour).
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "hub/hub_internal.h"

namespace vlm::hub {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string dir_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

bool is_gguf(const std::string& p) { return ends_with(ascii_upper(p), ".GGUF"); }

// A GGUF file that holds a model (not a vision projector, importance matrix or draft head).
bool is_gguf_model(const std::string& p) {
  if (!is_gguf(p)) return false;
  const std::string b = base_name(p);
  for (const char* not_model : {"mmproj", "imatrix", "mtp-", "eagle3-"}) {
    if (b.find(not_model) != std::string::npos) return false;
  }
  return true;
}

// A split GGUF file's part: NAME-00001-of-00003.gguf → {1, 3}; {1, 1} for a whole file.
std::pair<int, int> split_part(const std::string& p) {
  const std::string stem = p.substr(0, p.size() - 5);  // without .gguf
  const size_t of = stem.rfind("-of-");
  if (of == std::string::npos || of < 6 || stem.size() - of != 9) return {1, 1};
  const std::string idx = stem.substr(of - 5, 5), cnt = stem.substr(of + 4);
  if (stem[of - 6] != '-') return {1, 1};
  auto digits = [](const std::string& s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  };
  if (!digits(idx) || !digits(cnt)) return {1, 1};
  return {std::atoi(idx.c_str()), std::atoi(cnt.c_str())};
}

// The bits of a file's quantization tag (Q4_K_M → 4, F16 → 16, BF16 → 16); 0 when none.
int quant_bits(const std::string& p) {
  std::string stem = base_name(p);
  stem = stem.substr(0, stem.size() - 5);
  const size_t sep = stem.find_last_of("-.");
  const std::string tag = sep == std::string::npos ? stem : stem.substr(sep + 1);
  const size_t d = tag.find_first_of("0123456789");
  return d == std::string::npos ? 0 : std::atoi(tag.c_str() + d);
}

// The model file for `tag`: its name holds the tag as a word of its own (any case): after the
// start or '-', '.', '_', '/', and before '.' or '-' (so F16 is not BF16, nor Q4_K Q4_K_M).
std::optional<std::string> find_gguf_model(const std::vector<std::string>& paths,
                                           const std::string& tag) {
  const std::string t = ascii_upper(tag);
  for (const std::string& p : paths) {
    if (!is_gguf_model(p)) continue;
    const std::string u = ascii_upper(p);
    for (size_t at = u.find(t); at != std::string::npos; at = u.find(t, at + 1)) {
      const size_t end = at + t.size();
      const bool starts = at == 0 || std::string_view("-._/").find(u[at - 1]) != std::string::npos;
      if (starts && end < u.size() && (u[end] == '.' || u[end] == '-')) return p;
    }
  }
  return std::nullopt;
}

// The mmproj file for `model`: in its folder or one above, the deepest such folder first, then
// the one whose bits are closest to the model's.
std::string find_mmproj(const std::vector<std::string>& paths, const std::string& model) {
  const std::string model_dir = dir_name(model);
  std::string best;
  size_t best_depth = 0;
  int best_diff = 0;
  const int bits = quant_bits(model);
  for (const std::string& p : paths) {
    if (!is_gguf(p) || base_name(p).find("mmproj") == std::string::npos) continue;
    const std::string d = dir_name(p);
    const bool above = d.empty() || model_dir == d || model_dir.rfind(d + "/", 0) == 0;
    if (!above) continue;
    const size_t depth = d.empty() ? 0 : std::count(d.begin(), d.end(), '/') + 1;
    const int diff = std::abs(quant_bits(p) - bits);
    if (best.empty() || depth > best_depth || (depth == best_depth && diff < best_diff)) {
      best = p;
      best_depth = depth;
      best_diff = diff;
    }
  }
  return best;
}

std::string gguf_list(const std::vector<std::string>& paths) {
  std::string s;
  for (const std::string& p : paths) {
    if (is_gguf_model(p)) s += (s.empty() ? "" : ", ") + p;
  }
  return s.empty() ? "none" : s;
}

Result<Selection> select_gguf(const std::vector<std::string>& paths, const std::string& quant,
                              const std::string& repo_id) {
  std::optional<std::string> model;
  if (!quant.empty()) {
    model = find_gguf_model(paths, quant);
    if (!model) {
      return not_found(repo_id + " has no GGUF file for the quantization " + quant +
                       " (its GGUF files: " + gguf_list(paths) + ")");
    }
  } else {
    for (const char* tag : {"Q4_K_M", "Q8_0"}) {
      if (!model) model = find_gguf_model(paths, tag);
    }
    for (const std::string& p : paths) {
      if (!model && is_gguf_model(p)) model = p;
    }
    if (!model) return not_found(repo_id + " has no GGUF model file (only vision files)");
  }
  const auto [part, parts] = split_part(*model);
  if (parts > 1) {
    return unimplemented(repo_id + ": " + *model + " is part " + std::to_string(part) + " of " +
                         std::to_string(parts) +
                         " of a split GGUF model; vlm reads whole GGUF files (join the parts "
                         "with llama.cpp's llama-gguf-split --merge, then pass -m FILE.gguf)");
  }
  Selection s;
  s.model = *model;
  s.mmproj = find_mmproj(paths, *model);
  s.files.push_back(s.model);
  if (!s.mmproj.empty()) s.files.push_back(s.mmproj);
  return s;
}

// A sentence-transformers module's JSON configuration ("1_Pooling/config.json": the folders
// modules.json names, which say how an embedding model pools).
bool st_module_config(const std::string& p) {
  const size_t slash = p.find('/');
  if (slash == std::string::npos || p.find('/', slash + 1) != std::string::npos) return false;
  size_t digits = 0;
  while (digits < slash && std::isdigit(static_cast<unsigned char>(p[digits]))) ++digits;
  return digits > 0 && digits < slash && p[digits] == '_' && ends_with(p, ".json");
}

// A safetensors checkpoint's snapshot: every top-level file but weights in other formats (the
// weights, configurations, tokenizer and templates vlm loads, and the model card and licence,
// so that the snapshot is whole for other tools as well), and sentence-transformers' module
// configurations.
bool checkpoint_file(const std::string& p) {
  if (st_module_config(p)) return true;
  if (p.find('/') != std::string::npos) return false;
  for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".ot",
                          ".tflite", ".gguf", ".GGUF", ".npz", ".pkl", ".mlmodel", ".nemo"}) {
    if (ends_with(p, ext)) return false;
  }
  return true;
}

}  // namespace

Result<Selection> select_files(const std::vector<std::string>& paths, const std::string& quant,
                               const std::string& repo_id, bool weights) {
  const bool has_safetensors = std::any_of(paths.begin(), paths.end(), [](const std::string& p) {
    return p.find('/') == std::string::npos && ends_with(p, ".safetensors");
  });
  const bool has_gguf = std::any_of(paths.begin(), paths.end(), is_gguf_model);
  if (!quant.empty() && !has_gguf) {
    return not_found(repo_id + " has no GGUF files; ':" + quant +
                     "' names a GGUF repository's quantization (drop it for a safetensors "
                     "checkpoint)");
  }
  if (!quant.empty() || (!has_safetensors && has_gguf)) return select_gguf(paths, quant, repo_id);
  if (!has_safetensors) {
    std::string listing;
    for (size_t i = 0; i < paths.size() && i < 12; ++i) listing += (i ? ", " : "") + paths[i];
    if (paths.size() > 12) listing += ", ...";
    return not_found(repo_id +
                     " holds no weights vlm loads (a safetensors checkpoint or GGUF "
                     "files); its files: " +
                     (listing.empty() ? "none" : listing));
  }
  Selection s;
  for (const std::string& p : paths) {
    if (checkpoint_file(p) && (weights || !ends_with(p, ".safetensors"))) s.files.push_back(p);
  }
  return s;
}

}  // namespace vlm::hub
