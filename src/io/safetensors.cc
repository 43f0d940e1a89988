#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

namespace vlm {

// Views alias the file's bytes directly, and the format is little-endian on disk.
static_assert(std::endian::native == std::endian::little,
              "safetensors views need a little-endian host");

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A valid header nests at most 3 deep ({name: {shape: [..]}}). Rejecting deeper input before
// parsing keeps a hostile 100 MB "[[[[..." from costing gigabytes of JSON nodes.
constexpr int kMaxJsonDepth = 8;

// Tensor names come from the file; escape control bytes so a hostile name cannot garble a terminal.
std::string printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string tensor_prefix(const std::string& path, const std::string& name) {
  return path + ": tensor '" + printable(name) + "'";
}

// Returns false when the nesting depth of `text` (outside strings) exceeds kMaxJsonDepth.
bool json_depth_ok(const char* text, size_t n) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // skip the escaped character (it may be a quote)
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

// Parses a JSON text without letting an exception escape. On error returns a message (no prefix).
bool parse_json(const char* text, size_t n, json* out, std::string* error) {
  if (!json_depth_ok(text, n)) {
    *error = "JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return false;
  }
  try {
    *out = json::parse(text, text + n, /*cb=*/nullptr, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
    return true;
  } catch (const json::parse_error& e) {
    *error = "invalid JSON (parse error at byte " + std::to_string(e.byte) + ")";
  } catch (const std::exception& e) {
    *error = std::string("invalid JSON (") + e.what() + ")";
  }
  return false;
}

// Reads a JSON non-negative integer that fits in int64 (shape dims, offsets).
bool json_to_u63(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = u;
  return true;
}

std::string dtype_list(std::initializer_list<DType> allowed) {
  std::string s;
  size_t i = 0;
  for (DType t : allowed) {
    if (i > 0) s += (i + 1 == allowed.size()) ? " or " : ", ";
    s += dtype_name(t);
    ++i;
  }
  return s;
}

// A byte range of the data section, used to check that tensors tile it exactly.
struct Span {
  uint64_t begin;
  uint64_t end;
  const std::string* name;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  VLM_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
  const uint8_t* bytes = f.file_.data();
  const uint64_t file_size = f.file_.size();

  if (file_size < 8) {
    return data_loss(path + ": file is " + std::to_string(file_size) +
                     " bytes, too short for the 8-byte safetensors header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return data_loss(path + ": header length " + std::to_string(header_len) +
                     " exceeds the limit of " + std::to_string(kMaxHeaderBytes) +
                     " bytes (not a safetensors file?)");
  }
  if (header_len > file_size - 8) {
    return data_loss(path + ": header length " + std::to_string(header_len) +
                     " runs past the end of the " + std::to_string(file_size) +
                     "-byte file (truncated?)");
  }
  f.data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - f.data_start_;

  json header;
  std::string err;
  if (!parse_json(reinterpret_cast<const char*>(bytes + 8), header_len, &header, &err)) {
    return data_loss(path + ": header: " + err);
  }
  if (!header.is_object()) return data_loss(path + ": header is not a JSON object");

  std::vector<Span> spans;
  spans.reserve(header.size());
  // Accessors below are all type-checked first; the try only guards allocation failure.
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) {
          return data_loss(path + ": __metadata__ is not a JSON object");
        }
        for (const auto& [k, v] : entry.items()) {
          if (!v.is_string()) {
            return data_loss(path + ": __metadata__ value for '" + printable(k) +
                             "' is not a string");
          }
          f.metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      const std::string where = tensor_prefix(path, name);
      if (!entry.is_object()) return data_loss(where + ": entry is not a JSON object");

      auto dt = entry.find("dtype");
      if (dt == entry.end() || !dt->is_string()) {
        return data_loss(where + ": missing or non-string \"dtype\"");
      }
      Entry e;
      const std::string& dtype_str = dt->get_ref<const std::string&>();
      if (!dtype_from_name(dtype_str, &e.dtype)) {
        return invalid_argument(where + ": unsupported dtype '" + printable(dtype_str) + "'");
      }

      auto sh = entry.find("shape");
      if (sh == entry.end() || !sh->is_array()) {
        return data_loss(where + ": missing or non-array \"shape\"");
      }
      // nbytes = prod(shape) * dtype_size, overflow-checked: a lying shape must not wrap around
      // to match a small byte range.
      uint64_t nbytes = dtype_size(e.dtype);
      for (const json& d : *sh) {
        uint64_t dim = 0;
        if (!json_to_u63(d, &dim)) {
          return data_loss(where + ": shape entry " + std::to_string(e.shape.size()) +
                           " is not a non-negative integer");
        }
        e.shape.push_back(static_cast<int64_t>(dim));
        if (__builtin_mul_overflow(nbytes, dim, &nbytes)) {
          return data_loss(where + ": shape " + shape_to_string(e.shape) +
                           "... overflows 64-bit byte count");
        }
      }

      auto off = entry.find("data_offsets");
      uint64_t begin = 0, end = 0;
      if (off == entry.end() || !off->is_array() || off->size() != 2 ||
          !json_to_u63((*off)[0], &begin) || !json_to_u63((*off)[1], &end)) {
        return data_loss(where + ": \"data_offsets\" must be [begin, end] non-negative integers");
      }
      const std::string offsets =
          "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
      if (begin > end) return data_loss(where + ": " + offsets + " has begin > end");
      if (end > data_size) {
        return data_loss(where + ": " + offsets + " end beyond the " + std::to_string(data_size) +
                         "-byte data section (file truncated?)");
      }
      if (end - begin != nbytes) {
        return data_loss(where + ": " + offsets + " span " + std::to_string(end - begin) +
                         " bytes but " + dtype_str + " " + shape_to_string(e.shape) + " needs " +
                         std::to_string(nbytes));
      }
      // Kernels read views as typed pointers; the mapping is page-aligned, so this is the offset
      // within the file. The reference writer's ordering always satisfies it.
      if ((f.data_start_ + begin) % dtype_size(e.dtype) != 0) {
        return data_loss(where + ": data at file offset " + std::to_string(f.data_start_ + begin) +
                         " is not aligned to its " + std::to_string(dtype_size(e.dtype)) +
                         "-byte elements");
      }
      e.begin = begin;
      auto [it, inserted] = f.tensors_.emplace(name, std::move(e));
      spans.push_back({begin, end, &it->first});
    }
  } catch (const std::exception& ex) {
    return internal_error(path + ": while reading header: " + ex.what());
  }

  // Like the reference loader, require the tensors to tile the data section with no gaps, overlaps
  // or trailing bytes: anything else means the header and the data disagree.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Span& s : spans) {
    if (s.begin != covered) {
      return data_loss(tensor_prefix(path, *s.name) + ": data_offsets begin " +
                       std::to_string(s.begin) + " but the previous tensor ends at " +
                       std::to_string(covered) + " (overlap or gap)");
    }
    covered = s.end;
  }
  if (covered != data_size) {
    return data_loss(path + ": tensors cover " + std::to_string(covered) + " of the " +
                     std::to_string(data_size) + "-byte data section (trailing bytes)");
  }
  return f;
}

Result<TensorView> SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return not_found(tensor_prefix(path(), name) + " not found");
  TensorView v;
  v.dtype = it->second.dtype;
  v.shape = it->second.shape;
  v.data = file_.data() + data_start_ + it->second.begin;
  return v;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

// ---------------------------------------------------------------------------------------------
// WeightStore

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// Index files list one line per tensor; even a 1000-layer model stays far below this.
constexpr uint64_t kMaxIndexBytes = 100u * 1000 * 1000;

// True when anything is at `p`, even a dangling symlink (an HF cache whose blob is missing), so the
// open that follows reports that path rather than claiming the checkpoint has no such file.
bool path_present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// Reads the index's weight_map into shard -> tensor names. Shard names must be plain file names in
// the checkpoint directory (HF never writes anything else, and this keeps "../" out).
Status read_index(const std::string& index_path,
                  std::map<std::string, std::vector<std::string>>* by_shard) {
  VLM_ASSIGN_OR_RETURN(MappedFile mf, MappedFile::open(index_path));
  if (mf.size() > kMaxIndexBytes) {
    return data_loss(index_path + ": " + std::to_string(mf.size()) + " bytes exceeds the " +
                     std::to_string(kMaxIndexBytes) + "-byte limit");
  }
  json index;
  std::string err;
  const char* text = reinterpret_cast<const char*>(mf.data());
  if (!parse_json(text ? text : "", mf.size(), &index, &err)) {
    return data_loss(index_path + ": " + err);
  }
  if (!index.is_object()) return data_loss(index_path + ": not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return data_loss(index_path + ": missing or non-object \"weight_map\"");
  }
  try {
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) {
        return data_loss(index_path + ": weight_map entry for tensor '" + printable(tensor) +
                         "' is not a string");
      }
      const std::string& s = shard.get_ref<const std::string&>();
      if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos) {
        return data_loss(index_path + ": tensor '" + printable(tensor) + "' maps to shard '" +
                         printable(s) + "', which is not a plain file name");
      }
      (*by_shard)[s].push_back(tensor);
    }
  } catch (const std::exception& ex) {
    return internal_error(index_path + ": " + ex.what());
  }
  return ok_status();
}

}  // namespace

Result<WeightStore> WeightStore::open_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found("checkpoint directory '" + dir + "' does not exist or is not a directory");
  }
  WeightStore store;
  store.dir_ = dir;
  const fs::path single = fs::path(dir) / kSingleFile;
  const fs::path index = fs::path(dir) / kIndexFile;

  if (path_present(single)) {
    VLM_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single.string()));
    for (const std::string& name : f.names()) store.where_[name] = 0;
    store.files_.push_back(std::move(f));
    return store;
  }
  if (!path_present(index)) {
    return not_found("no " + std::string(kSingleFile) + " or " + kIndexFile + " in '" + dir + "'");
  }

  const std::string index_path = index.string();
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensors it holds
  VLM_RETURN_IF_ERROR(read_index(index_path, &by_shard));
  if (by_shard.empty()) return data_loss(index_path + ": weight_map is empty");

  for (const auto& [shard, tensors] : by_shard) {
    const std::string shard_path = (fs::path(dir) / shard).string();
    auto opened = SafetensorsFile::open(shard_path);
    if (!opened.ok()) return opened.status().with_context(index_path);
    const size_t idx = store.files_.size();
    for (const std::string& t : tensors) {
      if (!opened->has(t)) {
        return data_loss(index_path + ": tensor '" + printable(t) + "' is mapped to " + shard_path +
                         ", which does not contain it");
      }
      store.where_[t] = idx;
    }
    store.files_.push_back(std::move(opened).value());
  }

  // Tensors a shard holds but the index omits are still loadable (transformers reads whole
  // shards), unless two shards both hold one and the index does not say which is meant.
  std::map<std::string, size_t> extra;
  for (size_t i = 0; i < store.files_.size(); ++i) {
    for (const std::string& name : store.files_[i].names()) {
      if (store.where_.count(name) != 0) continue;
      auto [it, inserted] = extra.emplace(name, i);
      if (!inserted) {
        return data_loss(index_path + ": tensor '" + printable(name) + "' is in both " +
                         store.files_[it->second].path() + " and " + store.files_[i].path() +
                         " and the index names neither");
      }
    }
  }
  store.where_.insert(extra.begin(), extra.end());
  return store;
}

WeightStore WeightStore::from_views(std::string name, std::map<std::string, TensorView> views,
                                    std::map<std::string, std::string> origin,
                                    std::shared_ptr<const void> keep,
                                    std::vector<const MappedFile*> mappings) {
  WeightStore store;
  store.dir_ = std::move(name);
  store.views_ = std::move(views);
  store.origin_ = std::move(origin);
  store.keep_ = std::move(keep);
  store.mappings_ = std::move(mappings);
  return store;
}

Result<TensorView> WeightStore::get(const std::string& name) const {
  if (auto v = views_.find(name); v != views_.end()) return v->second;
  auto it = where_.find(name);
  if (it == where_.end()) {
    return not_found("tensor '" + printable(name) + "' not found in " + dir_);
  }
  return files_[it->second].get(name);
}

void WeightStore::release_pages(const TensorView& v) const { release_pages(v.data, v.nbytes()); }

void WeightStore::release_pages(const void* p, size_t n) const {
  for (const SafetensorsFile& f : files_) {
    if (f.release_pages(p, n)) return;
  }
  for (const MappedFile* m : mappings_) {
    if (m->release_pages(p, n)) return;
  }
}

namespace {

bool inside(const void* p, size_t n, const uint8_t* d, size_t size) {
  const auto* b = static_cast<const uint8_t*>(p);
  return d != nullptr && b >= d && n <= size && static_cast<size_t>(b - d) <= size - n;
}

}  // namespace

bool WeightStore::holds(const void* p, size_t n) const {
  for (const SafetensorsFile& f : files_) {
    if (inside(p, n, f.mapped_data(), f.mapped_size())) return true;
  }
  for (const MappedFile* m : mappings_) {
    if (inside(p, n, m->data(), m->size())) return true;
  }
  return false;
}

Result<TensorView> WeightStore::get(const std::string& name,
                                    const std::vector<int64_t>& expected_shape,
                                    std::initializer_list<DType> allowed) const {
  VLM_ASSIGN_OR_RETURN(TensorView v, get(name));
  const std::string where = tensor_prefix(file_of(name), name);
  if (v.shape != expected_shape) {
    return invalid_argument(where + ": expected shape " + shape_to_string(expected_shape) +
                            ", got " + shape_to_string(v.shape));
  }
  if (allowed.size() != 0 && std::find(allowed.begin(), allowed.end(), v.dtype) == allowed.end()) {
    return invalid_argument(where + ": expected dtype " + dtype_list(allowed) + ", got " +
                            dtype_name(v.dtype));
  }
  return v;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, idx] : where_) out.push_back(name);
  for (const auto& [name, v] : views_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string WeightStore::file_of(const std::string& name) const {
  if (views_.count(name) != 0) {
    auto o = origin_.find(name);
    return o == origin_.end() ? dir_ : o->second;
  }
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : files_[it->second].path();
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// Closes (and on failure removes) the temporary file unless released after a successful rename.
class TmpFile {
 public:
  explicit TmpFile(std::string path) : path_(std::move(path)) {
    fp_ = std::fopen(path_.c_str(), "wb");
  }
  ~TmpFile() {
    if (fp_ != nullptr) std::fclose(fp_);
    if (!committed_) std::remove(path_.c_str());
  }
  TmpFile(const TmpFile&) = delete;
  TmpFile& operator=(const TmpFile&) = delete;

  FILE* fp() const { return fp_; }
  bool write(const void* p, size_t n) { return n == 0 || std::fwrite(p, 1, n, fp_) == n; }
  // Flushes and closes; false on error (errno set).
  bool close() {
    int rc = std::fclose(fp_);
    fp_ = nullptr;
    return rc == 0;
  }
  void commit() { committed_ = true; }

 private:
  std::string path_;
  FILE* fp_ = nullptr;
  bool committed_ = false;
};

}  // namespace

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // Validate first and compute byte sizes; nothing touches the disk until the header is built.
  std::vector<uint64_t> nbytes(tensors.size());
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, v] = tensors[i];
    const std::string where = tensor_prefix(path, name);
    if (name == "__metadata__") return invalid_argument(where + ": reserved name");
    if (!seen.emplace(name, i).second) return invalid_argument(where + ": duplicate name");
    // Packed sub-byte weights (made at load time) have no safetensors dtype.
    if (dtype_block(v.dtype) != 1) {
      return invalid_argument(where + ": " + dtype_name(v.dtype) + " is not a safetensors dtype");
    }
    uint64_t n = dtype_size(v.dtype);
    for (int64_t d : v.shape) {
      if (d < 0) return invalid_argument(where + ": negative dim in " + shape_to_string(v.shape));
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
        return invalid_argument(where + ": byte size of " + shape_to_string(v.shape) +
                                " overflows");
      }
    }
    if (n > 0 && v.data == nullptr) return invalid_argument(where + ": null data");
    nbytes[i] = n;
  }

  // The reference writer's order: larger elements first, then by name. Every tensor's size is a
  // multiple of its element size, so each begins aligned with no padding between tensors.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    size_t sa = dtype_size(tensors[a].second.dtype), sb = dtype_size(tensors[b].second.dtype);
    return sa != sb ? sa > sb : tensors[a].first < tensors[b].first;
  });

  std::string header;
  try {
    json h = json::object();
    if (!metadata.empty()) {
      json m = json::object();
      for (const auto& [k, v] : metadata) m[k] = v;
      h["__metadata__"] = std::move(m);
    }
    uint64_t offset = 0;
    for (size_t i : order) {
      const TensorView& v = tensors[i].second;
      h[tensors[i].first] = {{"dtype", dtype_name(v.dtype)},
                             {"shape", v.shape},
                             {"data_offsets", {offset, offset + nbytes[i]}}};
      offset += nbytes[i];
    }
    header = h.dump();  // throws on names that are not valid UTF-8
  } catch (const std::exception& ex) {
    return invalid_argument(path + ": cannot build header: " + ex.what());
  }
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  uint8_t len_le[8];
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(len >> (8 * i));

  const std::string tmp_path = path + ".tmp";
  TmpFile tmp(tmp_path);
  if (tmp.fp() == nullptr) {
    return invalid_argument("cannot create '" + tmp_path + "': " + std::strerror(errno));
  }
  bool ok = tmp.write(len_le, 8) && tmp.write(header.data(), header.size());
  for (size_t k = 0; ok && k < order.size(); ++k) {
    ok = tmp.write(tensors[order[k]].second.data, nbytes[order[k]]);
  }
  if (!ok || !tmp.close()) {
    return internal_error("cannot write '" + tmp_path + "': " + std::strerror(errno));
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    return internal_error("cannot rename '" + tmp_path + "' to '" + path +
                          "': " + std::strerror(errno));
  }
  tmp.commit();
  return ok_status();
}

}  // namespace vlm
