// Model names, the environment huggingface_hub reads, and small text helpers.
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "hub/hub_internal.h"

namespace vlm::hub {
namespace {

// A repository name part as the hub allows it: letters, digits, '-', '_', '.'; not starting or
// ending with '-' or '.', no "--" or "..", at most 96 characters.
bool valid_name_part(std::string_view s) {
  if (s.empty() || s.size() > 96) return false;
  for (char c : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  if (s.front() == '-' || s.front() == '.' || s.back() == '-' || s.back() == '.') return false;
  return s.find("--") == std::string_view::npos && s.find("..") == std::string_view::npos;
}

bool valid_revision(std::string_view s) {
  if (s.empty() || s.size() > 255 || s.front() == '/' || s.back() == '/') return false;
  if (s.find("..") != std::string_view::npos || s.front() == '.' ||
      s.find("/.") != std::string_view::npos || s.find("//") != std::string_view::npos) {
    return false;  // as git refuses them: no empty part, none starting with '.'
  }
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '~' || c == '^' || c == '?' ||
        c == '*' || c == '[' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      return false;
    }
  }
  return true;
}

bool valid_quant(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return false;
  }
  return true;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// huggingface_hub's _is_true: 1, ON, YES, TRUE in any case.
bool env_true(const char* name) {
  const std::string v = ascii_upper(env(name));
  return v == "1" || v == "ON" || v == "YES" || v == "TRUE";
}

}  // namespace

std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim_space(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  const size_t end = s.find_last_not_of(ws);
  s.erase(end == std::string::npos ? 0 : end + 1);
  return s;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string printable(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s.substr(0, 200)) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (s.size() > 200 ? "...\"" : "\"");
}

std::string ModelName::str() const {
  std::string s = repo_id;
  if (revision_given) s += "@" + revision;
  if (!quant.empty()) s += ":" + quant;
  return s;
}

Result<ModelName> parse_model_name(std::string_view text) {
  const std::string whole(text);
  auto bad = [&](const char* why) {
    std::string m = "'";
    m.append(whole).append("' is no model name ORG/NAME[@REVISION][:QUANT]: ").append(why);
    return invalid_argument(m);
  };
  ModelName n;
  if (const size_t colon = text.find(':'); colon != std::string_view::npos) {
    n.quant = std::string(text.substr(colon + 1));
    text = text.substr(0, colon);
    if (!valid_quant(n.quant)) return bad("the quantization after ':' is empty or not a tag");
  }
  if (const size_t at = text.find('@'); at != std::string_view::npos) {
    n.revision = std::string(text.substr(at + 1));
    n.revision_given = true;
    text = text.substr(0, at);
    if (!valid_revision(n.revision)) return bad("the revision after '@' is empty or malformed");
  }
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return bad("no '/' between the owner and the name");
  if (!valid_name_part(text.substr(0, slash)) || !valid_name_part(text.substr(slash + 1))) {
    return bad("the owner and the name are letters, digits, '-', '_' and '.'");
  }
  n.repo_id = std::string(text);
  return n;
}

bool is_model_name(const std::string& arg) {
  if (arg.empty() || arg[0] == '/' || arg[0] == '.' || arg[0] == '~') return false;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(arg, ec))) return false;  // a dangling link is a path too
  return parse_model_name(arg).ok();
}

HubOptions options_from_env(const std::string& token) {
  HubOptions o;
  o.endpoint = env("HF_ENDPOINT");
  if (o.endpoint.empty()) o.endpoint = "https://huggingface.co";
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  std::string home = env("HF_HOME");
  if (home.empty()) {
    std::string xdg = env("XDG_CACHE_HOME");
    if (xdg.empty()) xdg = env("HOME") + "/.cache";
    home = xdg + "/huggingface";
  }
  // The older names huggingface_hub still reads come second.
  o.cache_dir = env("HF_HUB_CACHE");
  if (o.cache_dir.empty()) o.cache_dir = env("HUGGINGFACE_HUB_CACHE");
  if (o.cache_dir.empty()) o.cache_dir = home + "/hub";
  o.offline = env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE");
  o.token = trim_space(token);
  if (o.token.empty()) o.token = trim_space(env("HF_TOKEN"));
  if (o.token.empty()) o.token = trim_space(env("HUGGING_FACE_HUB_TOKEN"));
  if (o.token.empty()) {
    std::string path = env("HF_TOKEN_PATH");
    if (path.empty()) path = home + "/token";
    o.token = trim_space(read_text(path));
  }
  return o;
}

std::string repo_folder_name(const std::string& repo_id) {
  std::string s = "models--" + repo_id;
  const size_t slash = s.find('/');
  if (slash != std::string::npos) s.replace(slash, 1, "--");
  return s;
}

std::optional<std::string> repo_id_from_folder(const std::string& folder) {
  const std::string prefix = "models--";
  if (folder.rfind(prefix, 0) != 0 || folder.size() == prefix.size()) return std::nullopt;
  const std::string rest = folder.substr(prefix.size());
  const size_t sep = rest.find("--");
  if (sep == std::string::npos) return rest;
  std::string id = rest.substr(0, sep);
  id.push_back('/');
  id.append(rest, sep + 2, std::string::npos);
  return id;
}

bool is_hex(const std::string& s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

bool is_commit_hash(const std::string& s) { return is_hex(s, 40); }

bool is_safe_repo_path(const std::string& path) {
  if (path.empty() || path.size() > 4096 || path.front() == '/') return false;
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  for (char c : path) {
    if (c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
  }
  return true;
}

bool is_valid_repo_file(const RepoFile& f) {
  return is_safe_repo_path(f.path) && f.size >= 0 && is_hex(f.blob_id, 40) &&
         (f.lfs_sha256.empty() || is_hex(f.lfs_sha256, 64));
}

std::string url_quote(const std::string& s, bool safe_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (safe_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace vlm::hub
