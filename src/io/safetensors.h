// Safetensors checkpoints: one mmap'd file (SafetensorsFile), a checkpoint directory that may be
// sharded (WeightStore), and a small writer for tests and tools.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N
// bytes of JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}, then the data section; offsets are relative to the data section.
//
// Everything read from disk is validated before any view is handed out, so a hostile or truncated
// file yields a Status naming the file (and tensor), never an out-of-bounds read or an exception.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"
#include "vlm/status.h"

namespace vlm {

// One parsed, validated .safetensors file. Move-only (it owns the mapping); views returned by get()
// point into the mapping and stay valid while this object (or whatever it was moved into) lives.
class SafetensorsFile {
 public:
  // Largest JSON header accepted. The reference implementation uses the same 100 MB cap; real
  // headers are well under 1 MB even for 1000+ tensors.
  static constexpr uint64_t kMaxHeaderBytes = 100u * 1000 * 1000;

  // Maps and validates `path`: header length, JSON shape, dtypes, shapes, offsets (in bounds,
  // matching numel * dtype size, contiguous and covering the data section exactly as the reference
  // writer lays them out), and element alignment of every tensor's bytes. Errors: NotFound (no such
  // file), DataLoss (corrupt or truncated), InvalidArgument (unsupported dtype).
  static Result<SafetensorsFile> open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return file_.path(); }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // NotFound "<path>: tensor 'X' not found" when absent.
  Result<TensorView> get(const std::string& name) const;
  // Tensor names in sorted order.
  std::vector<std::string> names() const;
  size_t num_tensors() const { return tensors_.size(); }
  // The optional "__metadata__" string map (e.g. {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // See MappedFile::release_pages; false when the range is not in this file.
  bool release_pages(const void* p, size_t n) const { return file_.release_pages(p, n); }
  // The whole file's mapping.
  const MappedFile& mapping() const { return file_; }
  const uint8_t* mapped_data() const { return file_.data(); }
  size_t mapped_size() const { return file_.size(); }

 private:
  struct Entry {
    DType dtype = DType::kF32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offset into the data section
  };

  SafetensorsFile() = default;

  MappedFile file_;
  uint64_t data_start_ = 0;  // file offset of the data section: 8 + header length
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: `model.safetensors`, or `model.safetensors.index.json` whose "weight_map"
// maps each tensor name to a shard file in the same directory. Every shard is opened and validated
// up front. Move-only; views point into the shards' mappings, which the store keeps alive.
class WeightStore {
 public:
  // Prefers model.safetensors when both exist (as transformers does). Errors: NotFound naming the
  // directory when neither file exists; NotFound naming a missing shard; DataLoss for an index
  // naming a tensor that its shard lacks, or for any corrupt shard (message names the shard).
  static Result<WeightStore> open_dir(const std::string& dir);
  // A store of tensors read from elsewhere (a GGUF checkpoint's, under the names the loaders
  // read): `views` point into memory that `keep` owns (or keeps mapped); `origin` names, for each
  // name, where its bytes came from in error messages (its file and tensor there); `mappings`, the
  // files whose mapped bytes views may point into (for holds() and release_pages()).
  static WeightStore from_views(std::string name, std::map<std::string, TensorView> views,
                                std::map<std::string, std::string> origin,
                                std::shared_ptr<const void> keep,
                                std::vector<const MappedFile*> mappings = {});

  WeightStore(WeightStore&&) noexcept = default;
  WeightStore& operator=(WeightStore&&) noexcept = default;

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const {
    return where_.count(name) != 0 || views_.count(name) != 0;
  }
  // NotFound "tensor 'X' not found in <dir>" when absent.
  Result<TensorView> get(const std::string& name) const;
  // As get(), and checks the shape and that the dtype is one of `allowed` (any dtype when empty).
  // Errors name the shard: "<dir>/model.safetensors: tensor 'X': expected shape [2048, 2048], got
  // [2048, 1024]" / "...: expected dtype BF16 or F32, got F16".
  Result<TensorView> get(const std::string& name, const std::vector<int64_t>& expected_shape,
                         std::initializer_list<DType> allowed) const;
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  // Path of the shard holding `name`, or "" when absent.
  std::string file_of(const std::string& name) const;
  // The opened shard files (one for an unsharded checkpoint), in shard-name order.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // MappedFile::release_pages for a view this store handed out (no-op for any other memory): its
  // bytes stay readable, but stop counting in RSS until read again.
  void release_pages(const TensorView& v) const;
  // The same for any byte range inside one shard's mapping.
  void release_pages(const void* p, size_t n) const;
  // Whether [p, p + n) lies inside one of the shards' mappings (a view this store handed out).
  bool holds(const void* p, size_t n) const;

 private:
  WeightStore() = default;

  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
  // from_views(): the tensors, where each came from, and what keeps their bytes alive.
  std::map<std::string, TensorView> views_;
  std::map<std::string, std::string> origin_;
  std::shared_ptr<const void> keep_;
  std::vector<const MappedFile*> mappings_;  // owned by keep_
};

// Writes a valid .safetensors file the way the reference writer does: tensors ordered by element
// size (largest first) then name, so every tensor is aligned without gaps; header padded with
// spaces to a multiple of 8. Writes to "<path>.tmp" and renames, so a failed write never leaves a
// half-written file at `path`. Each view must be contiguous with nbytes() readable at data.
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace vlm
