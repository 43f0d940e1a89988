// Image decoding: JPEG, PNG, WebP, GIF and BMP bytes -> 8-bit RGB (vision/image.h).
//
// The pixels match what the reference pipeline sees: transformers opens images with PIL and calls
// Image.convert("RGB"), so alpha is dropped (not composited), palettes are expanded, grey is
// replicated, and EXIF orientation is NOT applied. docs/image_decoding.md lists the rules per
// format and the few documented differences from PIL.
//
// Every failure (empty, truncated, corrupt, unknown, too large) returns a Status naming the format
// and the problem; no input makes the decoders abort, longjmp through our frames or read out of
// bounds. Image dimensions are checked against ImageDecodeLimits from the header, before any pixel
// buffer is allocated, so a "65000 x 65000" header costs a few bytes of work, not gigabytes.
// Thread-safety: all functions are reentrant (no global state; each call owns its decoder).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "vision/image.h"
#include "vlm/status.h"

namespace vlm {

// Bounds on what a decode may cost. The defaults admit any photo a camera produces (50 MP) while
// capping one image's RGB buffer at 150 MB.
struct ImageDecodeLimits {
  int64_t max_pixels = 50'000'000;  // width * height
  int64_t max_side = 32768;         // width and height, each
  int64_t max_bytes = 64 << 20;     // encoded input size
  // Called with the image's size once its header is read, before any pixel buffer exists (after
  // the checks above); an error it returns is the decode's. The engine prices an image in tokens
  // here, so that an image the context cannot hold is refused before it is decoded.
  std::function<Status(int64_t width, int64_t height)> on_size;
};

enum class ImageFormat { kJpeg, kPng, kWebp, kGif, kBmp };

// Decodes one image (the first frame of an animation) from memory. The format is sniffed from the
// magic bytes, never from a file name. Errors: kInvalidArgument for unknown, corrupt, truncated,
// unsupported or over-limit input (the message starts with the format name), kUnavailable when the
// pixel buffer cannot be allocated. Messages never quote the input's bytes.
Result<Image> decode_image(const uint8_t* data, size_t size, const ImageDecodeLimits& limits = {});

// Reads an image file's bytes (at most limits.max_bytes). Errors name the path (kNotFound when it
// does not exist).
Result<std::vector<uint8_t>> read_image_file(const std::string& path,
                                             const ImageDecodeLimits& limits = {});

// Reads `path` and decodes it. Errors name the path (kNotFound when it does not exist).
Result<Image> load_image_file(const std::string& path, const ImageDecodeLimits& limits = {});

// "JPEG", "PNG", "WebP", "GIF", "BMP".
const char* image_format_name(ImageFormat format);

// Per-format decoders (image_decode_<format>.cc), called by decode_image after sniffing. Not part
// of the API: they assume the magic bytes matched and size <= limits.max_bytes.
namespace image_decode_internal {

Result<Image> decode_jpeg(const uint8_t* data, size_t size, const ImageDecodeLimits& limits);
Result<Image> decode_png(const uint8_t* data, size_t size, const ImageDecodeLimits& limits);
Result<Image> decode_webp(const uint8_t* data, size_t size, const ImageDecodeLimits& limits);
Result<Image> decode_gif(const uint8_t* data, size_t size, const ImageDecodeLimits& limits);
Result<Image> decode_bmp(const uint8_t* data, size_t size, const ImageDecodeLimits& limits);

// kInvalidArgument "<format>: <what>".
Status format_error(ImageFormat format, const std::string& what);

// Checks header dimensions against the limits (and rejects zero sides) before anything is
// allocated.
Status check_dimensions(ImageFormat format, int64_t width, int64_t height,
                        const ImageDecodeLimits& limits);

// An Image of width x height with a zero-filled rgb buffer; fails with kUnavailable instead
// of throwing when memory runs out. Call check_dimensions first.
Result<Image> allocate_image(ImageFormat format, int64_t width, int64_t height);

}  // namespace image_decode_internal
}  // namespace vlm
