#include "kernels/cuda/stream.h"

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/runtime.h"

namespace vlm::cuda {

Status Stream::create(std::unique_ptr<Stream>* out) {
  std::unique_ptr<Stream> s(new Stream());
  cudaStream_t h = nullptr;
  VLM_RETURN_IF_ERROR(cuda_status(cudaStreamCreate(&h), "stream create"));
  s->s_ = h;
  *out = std::move(s);
  return ok_status();
}

Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(s_));
}

Status PinnedBuffer::allocate(size_t bytes, PinnedBuffer* out) {
  PinnedBuffer b;
  if (bytes > 0) VLM_RETURN_IF_ERROR(cuda_status(cudaMallocHost(&b.p_, bytes), "cudaMallocHost"));
  b.bytes_ = bytes;
  *out = std::move(b);
  return ok_status();
}

PinnedBuffer::~PinnedBuffer() {
  if (p_ != nullptr) cudaFreeHost(p_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) cudaFreeHost(p_);
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Status copy_to_device_async(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, launch_stream()),
                     "copy to device");
}

Status copy_to_host_async(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, launch_stream()),
                     "copy to host");
}

Status copy_2d_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t height) {
  if (width == 0 || height == 0) return ok_status();
  return cuda_status(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                                       cudaMemcpyDeviceToDevice, launch_stream()),
                     "2-D copy");
}

Status zero_device(void* device, size_t bytes) {
  if (bytes == 0) return ok_status();
  return cuda_status(cudaMemset(device, 0, bytes), "memset");
}

Status stream_synchronize() {
  return cuda_status(cudaStreamSynchronize(launch_stream()), "stream synchronize");
}

Status Graph::begin_capture() {
  return cuda_status(cudaStreamBeginCapture(launch_stream(), cudaStreamCaptureModeThreadLocal),
                     "begin capture");
}

Status Graph::end_capture(std::unique_ptr<Graph>* out) {
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(launch_stream(), &g);
  if (end != cudaSuccess) {
    if (g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();  // a failed capture's error is not sticky; clear it
    return cuda_status(end, "end capture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    return cuda_status(inst, "graph instantiate");
  }
  std::unique_ptr<Graph> graph(new Graph());
  graph->exec_ = exec;
  *out = std::move(graph);
  return ok_status();
}

Graph::~Graph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

Status Graph::launch() const {
  return cuda_status(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), launch_stream()),
                     "graph launch");
}

}  // namespace vlm::cuda
