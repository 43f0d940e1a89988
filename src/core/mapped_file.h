// Read-only memory map of a whole file. Weights are served straight from the page cache: the loader
// hands out TensorViews into the map instead of copying gigabytes into the heap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "vlm/status.h"

namespace vlm {

// Owns one read-only, private mapping. Move-only; the bytes stay valid (at the same address) until
// the owning object is destroyed, so views taken from data() survive moves of the MappedFile.
// Thread-safety: const methods may be called concurrently.
// NOTE: truncating the file on disk while it is mapped makes reads past the new end fault (SIGBUS);
// like every mmap loader (safetensors, llama.cpp) we require checkpoints not to change under us.
class MappedFile {
 public:
  // Maps `path` read-only. Errors (NotFound, InvalidArgument for a non-regular file, Internal for
  // mmap failure) name the path and the errno text. An empty file yields a valid object with
  // size() == 0 and data() == nullptr, since mmap of length 0 is invalid.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Drops this process's resident copy of the whole pages inside [p, p + n) (madvise DONTNEED).
  // The bytes stay valid and unchanged: a later read faults them back in from the file. For ranges
  // that will not be read again soon (weights quantized into the heap at load), so they stop
  // counting in this process's RSS. Returns false, doing nothing, when the range is not inside
  // this mapping.
  bool release_pages(const void* p, size_t n) const;

 private:
  void reset();

  const uint8_t* data_ = nullptr;  // [size_] bytes, or nullptr when size_ == 0
  size_t size_ = 0;
  std::string path_;
};

}  // namespace vlm
