#include "npy_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace vlm_cli {

namespace {

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes, then major and minor version bytes
constexpr size_t kMagicLen = 6;
// numpy aligns the start of the data to 64 bytes (numpy.lib.format.ARRAY_ALIGN).
constexpr size_t kArrayAlign = 64;

std::string shape_to_tuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";  // Python's 1-tuple spelling
  return s + ")";
}

}  // namespace

vlm::Status write_npy_f32(const std::string& path, const float* data,
                          const std::vector<int64_t>& shape) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return vlm::invalid_argument(path + ": negative dim in " + shape_to_tuple(shape));
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
        numel > SIZE_MAX / sizeof(float)) {
      return vlm::invalid_argument(path + ": shape " + shape_to_tuple(shape) + " overflows");
    }
  }
  if (numel > 0 && data == nullptr) return vlm::invalid_argument(path + ": null data");

  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_to_tuple(shape) + ", }";
  // Pad with spaces and end with '\n' so magic + version + length + header is 64-aligned.
  const size_t prefix = kMagicLen + 2 + 2;
  const size_t unpadded = prefix + header.size() + 1;
  header.append((kArrayAlign - unpadded % kArrayAlign) % kArrayAlign, ' ');
  header += '\n';
  if (header.size() > 0xffff) return vlm::invalid_argument(path + ": header too long for npy v1.0");

  unsigned char pre[10];
  std::memcpy(pre, kMagic, kMagicLen);
  pre[6] = 1;  // version 1.0
  pre[7] = 0;
  pre[8] = static_cast<unsigned char>(header.size() & 0xff);
  pre[9] = static_cast<unsigned char>(header.size() >> 8);

  FILE* fp = std::fopen(path.c_str(), "wb");
  if (fp == nullptr) {
    return vlm::invalid_argument("cannot create '" + path + "': " + std::strerror(errno));
  }
  const size_t nbytes = static_cast<size_t>(numel) * sizeof(float);
  bool ok = std::fwrite(pre, 1, sizeof(pre), fp) == sizeof(pre) &&
            std::fwrite(header.data(), 1, header.size(), fp) == header.size() &&
            (nbytes == 0 || std::fwrite(data, 1, nbytes, fp) == nbytes);
  int err = errno;
  if (std::fclose(fp) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(path.c_str());
    return vlm::internal_error("cannot write '" + path + "': " + std::strerror(err));
  }
  return vlm::ok_status();
}

}  // namespace vlm_cli
