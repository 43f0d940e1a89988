// Format sniffing, limits and file reading; the per-format decoders live in image_decode_*.cc.
#include "vision/image_decode.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <optional>
#include <utility>
#include <vector>

namespace vlm {

namespace {

using namespace image_decode_internal;  // NOLINT: this file implements that namespace's helpers

// The magic bytes PIL's plugins accept for the formats we decode.
std::optional<ImageFormat> sniff_format(const uint8_t* p, size_t n) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return ImageFormat::kJpeg;
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::kPng;
  // A RIFF file too short to show its type is reported as a truncated WebP, the only RIFF we read.
  if (n >= 4 && std::memcmp(p, "RIFF", 4) == 0 && (n < 12 || std::memcmp(p + 8, "WEBP", 4) == 0)) {
    return ImageFormat::kWebp;
  }
  if (n >= 6 && (std::memcmp(p, "GIF87a", 6) == 0 || std::memcmp(p, "GIF89a", 6) == 0)) {
    return ImageFormat::kGif;
  }
  if (n >= 2 && p[0] == 'B' && p[1] == 'M') return ImageFormat::kBmp;
  return std::nullopt;
}

// Up to 8 leading bytes as hex, so an "unknown format" error shows what the input actually was.

// Closes the descriptor on every return path.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// Reads the whole file. NOTE: read() rather than mmap: image paths are user input, and a file that
// shrinks under a mapping would SIGBUS the process instead of returning an error.
Result<std::vector<uint8_t>> read_file_bytes(const std::string& path, int64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = "cannot open image '" + path + "': " + std::strerror(err);
    if (err == ENOENT || err == ENOTDIR) return not_found(std::move(msg));
    return invalid_argument(std::move(msg));
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return internal_error("cannot stat image '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return invalid_argument("image '" + path + "' is not a regular file");
  if (st.st_size > max_bytes) {
    return invalid_argument("image '" + path + "' is " + std::to_string(st.st_size) +
                            " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kUnavailable, "out of memory reading image '" + path + "'");
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return invalid_argument("cannot read image '" + path + "': " + std::strerror(errno));
    }
    if (got == 0) break;  // the file shrank since fstat: decode what is there
    done += static_cast<size_t>(got);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kBmp:
      return "BMP";
  }
  return "unknown";
}

namespace image_decode_internal {

Status format_error(ImageFormat format, const std::string& what) {
  return invalid_argument(std::string(image_format_name(format)) + ": " + what);
}

Status check_dimensions(ImageFormat format, int64_t width, int64_t height,
                        const ImageDecodeLimits& limits) {
  if (width <= 0 || height <= 0) {
    return format_error(
        format, "invalid image size " + std::to_string(width) + "x" + std::to_string(height));
  }
  const std::string dims = std::to_string(width) + "x" + std::to_string(height);
  if (width > limits.max_side || height > limits.max_side) {
    return format_error(format, "image size " + dims + " exceeds the limit of " +
                                    std::to_string(limits.max_side) + " pixels per side");
  }
  // Both sides are <= max_side here, so the product cannot overflow for any sane limit; the
  // division form stays exact even for max_side near 2^32.
  if (width > limits.max_pixels / height) {
    return format_error(format, "image size " + dims + " (" + std::to_string(width * height) +
                                    " pixels) exceeds the limit of " +
                                    std::to_string(limits.max_pixels) + " pixels");
  }
  return limits.on_size ? limits.on_size(width, height) : ok_status();
}

Result<Image> allocate_image(ImageFormat format, int64_t width, int64_t height) {
  Image img;
  img.width = width;
  img.height = height;
  try {
    img.rgb.resize(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kUnavailable, std::string(image_format_name(format)) +
                                                ": out of memory for a " + std::to_string(width) +
                                                "x" + std::to_string(height) + " image");
  }
  return img;
}

}  // namespace image_decode_internal

Result<Image> decode_image(const uint8_t* data, size_t size, const ImageDecodeLimits& limits) {
  if (data == nullptr || size == 0) return invalid_argument("image data is empty");
  if (static_cast<uint64_t>(size) > static_cast<uint64_t>(limits.max_bytes)) {
    return invalid_argument("image data is " + std::to_string(size) +
                            " bytes, more than the limit of " + std::to_string(limits.max_bytes));
  }
  std::optional<ImageFormat> format = sniff_format(data, size);
  if (!format) {
    return invalid_argument("unrecognised image format (expected JPEG, PNG, WebP, GIF or BMP)");
  }
  switch (*format) {
    case ImageFormat::kJpeg:
      return decode_jpeg(data, size, limits);
    case ImageFormat::kPng:
      return decode_png(data, size, limits);
    case ImageFormat::kWebp:
      return decode_webp(data, size, limits);
    case ImageFormat::kGif:
      return decode_gif(data, size, limits);
    case ImageFormat::kBmp:
      return decode_bmp(data, size, limits);
  }
  return internal_error("unhandled image format");
}

Result<std::vector<uint8_t>> read_image_file(const std::string& path,
                                             const ImageDecodeLimits& limits) {
  return read_file_bytes(path, limits.max_bytes);
}

Result<Image> load_image_file(const std::string& path, const ImageDecodeLimits& limits) {
  VLM_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file_bytes(path, limits.max_bytes));
  Result<Image> img = decode_image(bytes.data(), bytes.size(), limits);
  if (!img.ok()) return img.status().with_context("image '" + path + "'");
  return img;
}

}  // namespace vlm
