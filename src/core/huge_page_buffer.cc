#include "core/huge_page_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace vlm {

Result<HugePageBuffer> HugePageBuffer::allocate(size_t bytes, bool noreserve) {
  HugePageBuffer b;
  if (bytes == 0) return b;
  if (bytes > std::numeric_limits<size_t>::max() - 2 * kHugePage) {
    return Status(StatusCode::kUnavailable,
                  "cannot map " + std::to_string(bytes) + " bytes: too large");
  }
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // One extra huge page of slack so that an aligned start exists inside the mapping.
  const size_t map_size = size + kHugePage;
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
  void* p = ::mmap(nullptr, map_size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    return Status(StatusCode::kUnavailable,
                  "cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  b.map_ = static_cast<uint8_t*>(p);
  b.map_size_ = map_size;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
  b.data_ = reinterpret_cast<uint8_t*>(start);
  b.size_ = size;
  // Advice only: without THP support the call fails and the memory stays ordinary pages. A
  // lazily written reservation (noreserve) stays on 4 KiB pages: see the header.
  ::madvise(b.data_, b.size_, noreserve ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
  return b;
}

HugePageBuffer::~HugePageBuffer() { reset(); }

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      map_size_(std::exchange(other.map_size_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    map_size_ = std::exchange(other.map_size_, 0);
  }
  return *this;
}

void HugePageBuffer::reset() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  data_ = map_ = nullptr;
  size_ = map_size_ = 0;
}

}  // namespace vlm
