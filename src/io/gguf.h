// GGUF files (llama.cpp's format: what Ollama, LM Studio and llama.cpp download), read in place:
// the header's key-value metadata and tensor table are parsed and checked up front, the tensors'
// bytes stay in the mapping. Versions 2 and 3 (little-endian), every metadata value type (arrays
// of arrays too), the alignment `general.alignment` gives (32 by default). Every bound is checked
// against the file: a truncated or corrupt file, an unknown type or an impossible shape is an
// error naming the file and what is wrong, never a read outside it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "vlm/status.h"

namespace vlm {

// A metadata value's type, as GGUF numbers them.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* gguf_type_name(GgufType t);

// A tensor's element type, as ggml numbers them (the ones GGUF files hold); its blocks:
// `block` elements in `bytes` bytes (1 element for the plain types).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};
struct GgmlBlock {
  int64_t block = 0;  // elements per block (0: not a type GGUF holds)
  int64_t bytes = 0;  // bytes per block
};
GgmlBlock ggml_block(GgmlType t);
const char* ggml_type_name(GgmlType t);  // "Q4_K"; "?" for an unknown number

// One metadata value. Scalars are read into the field of their kind; a string is a view into the
// file. An array keeps its element type and count; its items: numbers and bools as the file's
// bytes (item(k) reads one), strings as views, arrays as values.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t u = 0;      // kUint8 .. kUint64, kBool
  int64_t i = 0;       // kInt8 .. kInt64
  double f = 0;        // kFloat32, kFloat64
  std::string_view s;  // kString
  // kArray
  GgufType elem = GgufType::kUint8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;           // numbers and bools: count items, little-endian
  std::vector<std::string_view> strings;  // strings
  std::vector<GgufValue> arrays;          // arrays

  bool is_integer() const;
  // The value as an integer of any integer type (unsigned ones up to INT64_MAX), else nullopt.
  std::optional<int64_t> as_int() const;
  // Item k (< count) of an array of numbers or bools, as a value of its own.
  GgufValue item(uint64_t k) const;
};

// One tensor of the table. `shape` is ggml's order, the fastest-varying dimension first (ne[0]:
// a row's length); `data` points into the mapping.
struct GgufTensor {
  std::string name;
  std::vector<int64_t> shape;
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;
  int64_t numel() const;
};

class GgufFile {
 public:
  // Maps `path` and parses it. Errors name the path.
  static Result<GgufFile> open(const std::string& path);
  // Parses bytes held elsewhere (which must outlive the result); `name` names them in errors.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes, const std::string& name);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // the data section's, in the file
  uint64_t size() const { return size_; }                // the file's bytes
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // A value of the expected kind; NotFound or InvalidArgument naming the key otherwise.
  Result<std::string_view> get_string(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(std::string_view name) const;
  // The file's mapping (null for parse()).
  const MappedFile* mapping() const { return file_.get(); }
  // Drops the parsed metadata and tensor table, and this process's resident copy of the header's
  // pages (the token and merge strings of a tokenizer: megabytes), once a load has taken what it
  // needs: the tensors' bytes stay mapped. find / get_* / tensor then find nothing.
  void release_header();

 private:
  GgufFile() = default;
  std::string name_;
  std::unique_ptr<MappedFile> file_;  // null for parse()
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t size_ = 0;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
};

}  // namespace vlm
