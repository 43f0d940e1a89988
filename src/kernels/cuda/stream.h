#pragma once
// Streams, page-locked staging memory, asynchronous copies and CUDA graphs: what the
// decoder needs to capture a decode step once and replay it. The ops of cuda_ops.h, flash
// attention and Gemm launch on the calling thread's current stream (set_stream).
#include <cstddef>
#include <memory>

#include "kernels/cuda/cuda_ops.h"
#include "vlm/status.h"

namespace vlm::cuda {

// A stream of its own (blocking: the legacy default stream's synchronous copies still order
// against it).
class Stream {
 public:
  static Status create(std::unique_ptr<Stream>* out);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return s_; }  // cudaStream_t

 private:
  Stream() = default;
  void* s_ = nullptr;
};

// Makes `stream` the current stream of this thread until the scope ends.
class StreamScope {
 public:
  explicit StreamScope(void* stream) : prev_(current_stream()) { set_stream(stream); }
  ~StreamScope() { set_stream(prev_); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void* prev_;
};

// Page-locked host memory: copies between it and the device run asynchronously.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Status allocate(size_t bytes, PinnedBuffer* out);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Asynchronous copies on the current stream (host memory pinned for them to overlap).
Status copy_to_device_async(void* device, const void* host, size_t bytes);
Status copy_to_host_async(void* host, const void* device, size_t bytes);
// Device to device on the current stream: `height` rows of `width` bytes, rows `src_pitch` bytes
// apart in src and `dst_pitch` in dst (a column block of a wider matrix into its own).
Status copy_2d_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t height);
// Sets `bytes` of device memory to zero (synchronous).
Status zero_device(void* device, size_t bytes);
// Waits for the current stream's work.
Status stream_synchronize();

// An executable graph of the work launched on the current stream between begin_capture() and
// end_capture(); launch() replays it on the current stream. A failed capture leaves the stream
// usable and returns the error.
class Graph {
 public:
  static Status begin_capture();
  static Status end_capture(std::unique_ptr<Graph>* out);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Status launch() const;

 private:
  Graph() = default;
  void* exec_ = nullptr;  // cudaGraphExec_t
};

}  // namespace vlm::cuda
