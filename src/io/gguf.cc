#include "io/gguf.h"

#include <cstring>
#include <limits>

#include "core/tensor.h"

namespace vlm {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read little-endian
constexpr int kMaxDims = 4;              // ggml's GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;        // arrays of arrays: far more than any writer nests

// Reads the header sequentially; every read is checked against the end.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  size_t pos() const { return pos_; }
  size_t left() const { return n_ - pos_; }
  bool read(void* out, size_t k) {
    if (k > left()) return false;
    std::memcpy(out, p_ + pos_, k);
    pos_ += k;
    return true;
  }
  template <typename T>
  bool get(T* v) {
    return read(v, sizeof(T));
  }
  const uint8_t* here() const { return p_ + pos_; }
  void skip(size_t k) { pos_ += k; }  // (k <= left(), checked by the caller)
  bool string(std::string_view* s) {
    uint64_t len = 0;
    if (!get(&len) || len > left()) return false;
    *s = std::string_view(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return true;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

// The smallest encoding of one value of type t (for a count's sanity check), 0 for an unknown one.
size_t min_bytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 0;
}

// One scalar of type t from the bytes at p into *v (t a number or bool type).
void scalar_from(const uint8_t* p, GgufType t, GgufValue* v) {
  v->type = t;
  auto get = [&](auto tag) {
    decltype(tag) x{};
    std::memcpy(&x, p, sizeof(x));
    using X = decltype(tag);
    if constexpr (std::is_floating_point_v<X>) {
      v->f = static_cast<double>(x);
    } else if constexpr (std::is_signed_v<X>) {
      v->i = static_cast<int64_t>(x);
    } else {
      v->u = static_cast<uint64_t>(x);
    }
  };
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kBool:
      return get(uint8_t{});
    case GgufType::kInt8:
      return get(int8_t{});
    case GgufType::kUint16:
      return get(uint16_t{});
    case GgufType::kInt16:
      return get(int16_t{});
    case GgufType::kUint32:
      return get(uint32_t{});
    case GgufType::kInt32:
      return get(int32_t{});
    case GgufType::kFloat32:
      return get(float{});
    case GgufType::kUint64:
      return get(uint64_t{});
    case GgufType::kInt64:
      return get(int64_t{});
    case GgufType::kFloat64:
      return get(double{});
    case GgufType::kString:
    case GgufType::kArray:
      break;
  }
}

bool is_scalar(GgufType t) { return t != GgufType::kString && t != GgufType::kArray; }

// One value of type t into *v; an error message (empty: fine).
std::string read_value(Reader& r, GgufType t, int depth, GgufValue* v) {
  v->type = t;
  const size_t size = min_bytes(t);
  if (size == 0) return "unknown value type " + std::to_string(static_cast<uint32_t>(t));
  if (is_scalar(t)) {
    uint8_t b[8] = {};
    if (!r.read(b, size)) return "truncated value";
    scalar_from(b, t, v);
    if (t == GgufType::kBool && v->u > 1) return "a bool that is " + std::to_string(v->u);
    return {};
  }
  if (t == GgufType::kString) return r.string(&v->s) ? std::string() : "truncated string";
  uint32_t et = 0;
  if (!r.get(&et) || !r.get(&v->count)) return "truncated array";
  v->elem = static_cast<GgufType>(et);
  const size_t each = min_bytes(v->elem);
  if (each == 0) return "an array of unknown type " + std::to_string(et);
  if (v->elem == GgufType::kArray && depth >= kMaxArrayDepth) return "arrays nested too deep";
  if (v->count > r.left() / each) {
    return "an array of " + std::to_string(v->count) + " items longer than the file";
  }
  const auto n = static_cast<size_t>(v->count);
  if (is_scalar(v->elem)) {
    v->raw = r.here();
    r.skip(n * each);
    if (v->elem == GgufType::kBool) {
      for (size_t k = 0; k < n; ++k) {
        if (v->raw[k] > 1) return "a bool that is " + std::to_string(v->raw[k]);
      }
    }
    return {};
  }
  // Items are added as they are read, so that memory grows with what the file really holds (a
  // count alone, however large, allocates nothing).
  if (v->elem == GgufType::kString) {
    for (size_t k = 0; k < n; ++k) {
      std::string_view s;
      if (!r.string(&s)) return "truncated string";
      v->strings.push_back(s);
    }
    return {};
  }
  for (size_t k = 0; k < n; ++k) {
    GgufValue item;
    std::string e = read_value(r, GgufType::kArray, depth + 1, &item);
    if (!e.empty()) return e;
    v->arrays.push_back(std::move(item));
  }
  return {};
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "?";
}

GgmlBlock ggml_block(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
    case GgmlType::kI32:
      return {1, 4};
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kI16:
      return {1, 2};
    case GgmlType::kF64:
    case GgmlType::kI64:
      return {1, 8};
    case GgmlType::kI8:
      return {1, 1};
    case GgmlType::kQ4_0:
    case GgmlType::kIQ4_NL:
      return {32, 18};
    case GgmlType::kQ4_1:
      return {32, 20};
    case GgmlType::kQ5_0:
      return {32, 22};
    case GgmlType::kQ5_1:
      return {32, 24};
    case GgmlType::kQ8_0:
      return {32, 34};
    case GgmlType::kQ8_1:
      return {32, 40};
    case GgmlType::kNVFP4:
      return {64, 36};
    case GgmlType::kQ1_0:
      return {128, 18};
    case GgmlType::kMXFP4:
      return {32, 17};
    case GgmlType::kQ2_K:
      return {256, 84};
    case GgmlType::kQ3_K:
      return {256, 110};
    case GgmlType::kQ4_K:
      return {256, 144};
    case GgmlType::kQ5_K:
      return {256, 176};
    case GgmlType::kQ6_K:
      return {256, 210};
    case GgmlType::kQ8_K:
      return {256, 292};
    case GgmlType::kIQ2_XXS:
      return {256, 66};
    case GgmlType::kIQ2_XS:
      return {256, 74};
    case GgmlType::kIQ3_XXS:
      return {256, 98};
    case GgmlType::kIQ1_S:
      return {256, 50};
    case GgmlType::kIQ3_S:
      return {256, 110};
    case GgmlType::kIQ2_S:
      return {256, 82};
    case GgmlType::kIQ4_XS:
      return {256, 136};
    case GgmlType::kIQ1_M:
      return {256, 56};
    case GgmlType::kTQ1_0:
      return {256, 54};
    case GgmlType::kTQ2_0:
      return {256, 66};
  }
  return {};
}

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ5_1:
      return "Q5_1";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ8_1:
      return "Q8_1";
    case GgmlType::kQ2_K:
      return "Q2_K";
    case GgmlType::kQ3_K:
      return "Q3_K";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ5_K:
      return "Q5_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
    case GgmlType::kQ8_K:
      return "Q8_K";
    case GgmlType::kIQ2_XXS:
      return "IQ2_XXS";
    case GgmlType::kIQ2_XS:
      return "IQ2_XS";
    case GgmlType::kIQ3_XXS:
      return "IQ3_XXS";
    case GgmlType::kIQ1_S:
      return "IQ1_S";
    case GgmlType::kIQ4_NL:
      return "IQ4_NL";
    case GgmlType::kIQ3_S:
      return "IQ3_S";
    case GgmlType::kIQ2_S:
      return "IQ2_S";
    case GgmlType::kIQ4_XS:
      return "IQ4_XS";
    case GgmlType::kI8:
      return "I8";
    case GgmlType::kI16:
      return "I16";
    case GgmlType::kI32:
      return "I32";
    case GgmlType::kI64:
      return "I64";
    case GgmlType::kF64:
      return "F64";
    case GgmlType::kIQ1_M:
      return "IQ1_M";
    case GgmlType::kBF16:
      return "BF16";
    case GgmlType::kTQ1_0:
      return "TQ1_0";
    case GgmlType::kTQ2_0:
      return "TQ2_0";
    case GgmlType::kMXFP4:
      return "MXFP4";
    case GgmlType::kNVFP4:
      return "NVFP4";
    case GgmlType::kQ1_0:
      return "Q1_0";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

std::optional<int64_t> GgufValue::as_int() const {
  if (!is_integer()) return std::nullopt;
  switch (type) {
    case GgufType::kInt8:
    case GgufType::kInt16:
    case GgufType::kInt32:
    case GgufType::kInt64:
      return i;
    default:
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(u);
  }
}

GgufValue GgufValue::item(uint64_t k) const {
  GgufValue v;
  if (type == GgufType::kArray && raw != nullptr && k < count && is_scalar(elem)) {
    scalar_from(raw + k * min_bytes(elem), elem, &v);
  }
  return v;
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  VLM_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  auto mapped = std::make_unique<MappedFile>(std::move(f));
  VLM_ASSIGN_OR_RETURN(GgufFile g,
                       parse(std::span<const uint8_t>(mapped->data(), mapped->size()), path));
  g.file_ = std::move(mapped);
  return g;
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
  auto bad = [&](const std::string& what) { return data_loss(name + ": " + what); };
  GgufFile g;
  g.name_ = name;
  Reader r(bytes.data(), bytes.size());
  uint32_t magic = 0;
  if (!r.get(&magic) || magic != kMagic) return bad("not a GGUF file (no GGUF magic)");
  if (!r.get(&g.version_)) return bad("truncated header");
  if (g.version_ != 2 && g.version_ != 3) {
    return unimplemented(name + ": GGUF version " + std::to_string(g.version_) +
                         " (versions 2 and 3 are read)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (!r.get(&n_tensors) || !r.get(&n_kv)) return bad("truncated header");
  // Each key-value pair takes at least 13 bytes, each tensor 24: counts the file cannot hold
  // are corrupt (and never sized into memory).
  if (n_kv > r.left() / 13 || n_tensors > r.left() / 24) {
    return bad("the header counts " + std::to_string(n_kv) + " keys and " +
               std::to_string(n_tensors) + " tensors, more than the file holds");
  }
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string_view key;
    uint32_t type = 0;
    if (!r.string(&key) || !r.get(&type)) return bad("truncated metadata key " + std::to_string(k));
    GgufValue v;
    const std::string e = read_value(r, static_cast<GgufType>(type), 0, &v);
    if (!e.empty()) return bad("metadata '" + std::string(key) + "': " + e);
    if (!g.kv_.emplace(std::string(key), std::move(v)).second) {
      return bad("metadata key '" + std::string(key) + "' appears twice");
    }
  }
  if (const GgufValue* a = g.find("general.alignment")) {
    if (a->type != GgufType::kUint32 || a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return bad("general.alignment must be a power of two (uint32)");
    }
    g.alignment_ = a->u;
  }
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor& t = g.tensors_.emplace_back();  // as read: memory grows with the file's contents
    std::string_view tname;
    uint32_t dims = 0;
    if (!r.string(&tname) || !r.get(&dims)) return bad("truncated tensor " + std::to_string(k));
    t.name = std::string(tname);
    if (dims == 0 || dims > kMaxDims) {
      return bad("tensor '" + t.name + "' has " + std::to_string(dims) + " dimensions (1 to 4)");
    }
    t.shape.resize(dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      uint64_t ne = 0;
      if (!r.get(&ne)) return bad("truncated tensor '" + t.name + "'");
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / numel)) {
        return bad("tensor '" + t.name + "' has an impossible shape");
      }
      t.shape[d] = static_cast<int64_t>(ne);
      numel *= t.shape[d];
    }
    uint32_t type = 0;
    if (!r.get(&type) || !r.get(&t.offset)) return bad("truncated tensor '" + t.name + "'");
    t.type = static_cast<GgmlType>(type);
    const GgmlBlock b = ggml_block(t.type);
    if (b.block == 0) {
      return unimplemented(name + ": tensor '" + t.name + "' has ggml type " +
                           std::to_string(type) + ", which is not one GGUF files hold");
    }
    if (t.shape[0] % b.block != 0) {
      return bad("tensor '" + t.name + "': a row of " + std::to_string(t.shape[0]) +
                 " is not a whole number of " + ggml_type_name(t.type) + " blocks (" +
                 std::to_string(b.block) + ")");
    }
    // Checked before the product, which could wrap around: no tensor is larger than the file.
    const auto blocks = static_cast<uint64_t>(numel / b.block);
    if (blocks > bytes.size() / static_cast<uint64_t>(b.bytes)) {
      return bad("tensor '" + t.name + "' (" + shape_to_string(t.shape) + ", " +
                 ggml_type_name(t.type) + ") is larger than the file");
    }
    t.nbytes = blocks * static_cast<uint64_t>(b.bytes);
    if (t.offset % g.alignment_ != 0) {
      return bad("tensor '" + t.name + "' is not aligned to " + std::to_string(g.alignment_));
    }
    if (!g.by_name_.emplace(t.name, static_cast<size_t>(k)).second) {
      return bad("tensor '" + t.name + "' appears twice");
    }
  }
  // The data section starts at the next multiple of the alignment.
  const uint64_t start = (r.pos() + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  if (start > bytes.size() && n_tensors > 0) return bad("truncated before the tensor data");
  g.data_offset_ = start;
  g.size_ = bytes.size();
  const uint64_t data_size = bytes.size() > start ? bytes.size() - start : 0;
  for (GgufTensor& t : g.tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return bad("tensor '" + t.name + "' (" + std::to_string(t.nbytes) + " bytes at " +
                 std::to_string(t.offset) + ") runs past the end of the file");
    }
    t.data = bytes.data() + start + t.offset;
  }
  return g;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return not_found(name_ + ": no metadata '" + std::string(key) + "'");
  if (v->type != GgufType::kString) {
    return invalid_argument(name_ + ": metadata '" + std::string(key) + "' is a " +
                            gguf_type_name(v->type) + ", not a string");
  }
  return v->s;
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return not_found(name_ + ": no metadata '" + std::string(key) + "'");
  const std::optional<int64_t> i = v->as_int();
  if (!i) {
    return invalid_argument(name_ + ": metadata '" + std::string(key) + "' is a " +
                            gguf_type_name(v->type) + ", not an integer in range");
  }
  return *i;
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return not_found(name_ + ": no metadata '" + std::string(key) + "'");
  if (v->type == GgufType::kFloat32 || v->type == GgufType::kFloat64) return v->f;
  if (const std::optional<int64_t> i = v->as_int()) return static_cast<double>(*i);
  return invalid_argument(name_ + ": metadata '" + std::string(key) + "' is a " +
                          gguf_type_name(v->type) + ", not a number");
}

void GgufFile::release_header() {
  kv_ = {};
  std::vector<GgufTensor>().swap(tensors_);
  by_name_ = {};
  if (file_ != nullptr && file_->data() != nullptr) {
    file_->release_pages(file_->data(), static_cast<size_t>(data_offset_));
  }
}

const GgufTensor* GgufFile::tensor(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace vlm
