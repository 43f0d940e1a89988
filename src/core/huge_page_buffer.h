// Memory for the model's large weights (on 2 MiB pages) and the KV cache's lazy reservation (on
// 4 KiB pages).
#pragma once

#include <cstddef>
#include <cstdint>

#include "vlm/status.h"

namespace vlm {

// One anonymous, private, read-write mapping of at least `bytes`, aligned to 2 MiB and advised
// for transparent huge pages (madvise MADV_HUGEPAGE), so that the kernel backs it with 2 MiB
// pages where the system allows (THP "always" or "madvise"; with "never" it is ordinary memory
// and everything still works). Nothing is touched here: pages become resident (zeroed) when first
// written. With `noreserve` the mapping is not charged against the commit limit either
// (MAP_NORESERVE) and is kept off huge pages (MADV_NOHUGEPAGE, even under THP "always"): a KV cache
// reserved for many long sequences then costs only the 4 KiB pages its written blocks fall in (on 2
// MiB pages each layer's first block alone made 2 MiB resident: 112 MiB for the 2B shape's K and V
// before the tenth token, while decode at 2048 tokens of context ran as fast on 4 KiB pages);
// weights, copied in at once, are better refused at load than killed.
//
// NOTE(vlm): why. The GEMM's panel build and the decode kernels read 8-32 weight rows at once,
// and a BF16 row of the 2B model is 4 KiB: on the file mapping (4 KiB page-cache pages) every row
// is its own page, so each panel costs dozens of TLB misses and the hardware prefetchers stop at
// every row's end. Copied onto 2 MiB pages, prefill and decode of the 2B shape ran 8-17% faster
// (docs/benchmarks.md).
//
// Move-only; the bytes stay at the same address until the owner is destroyed.
class HugePageBuffer {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  // kUnavailable naming the size when the mapping fails or the size cannot be rounded up to
  // whole huge pages; bytes == 0 gives an empty buffer.
  static Result<HugePageBuffer> allocate(size_t bytes, bool noreserve = false);

  HugePageBuffer() = default;
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset();

  uint8_t* data_ = nullptr;  // 2 MiB aligned, size_ bytes (a multiple of kHugePage)
  uint8_t* map_ = nullptr;   // the whole mapping, map_size_ bytes (data_ plus alignment slack)
  size_t size_ = 0;
  size_t map_size_ = 0;
};

}  // namespace vlm
