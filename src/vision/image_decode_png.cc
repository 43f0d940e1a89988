// PNG via libspng: a small, fuzzed decoder that returns error codes (no setjmp, unlike libpng),
// bounds chunk sizes and memory, and converts any colour type to 8-bit RGB in its row loop.
#include <spng.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <string>

#include "vision/image_decode.h"

namespace vlm::image_decode_internal {

namespace {

constexpr ImageFormat kFmt = ImageFormat::kPng;

struct SpngDeleter {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

std::string spng_message(int err) {
  std::string what = spng_strerror(err);
  // These codes mean the data stopped before the image did.
  if (err == SPNG_IO_EOF || err == SPNG_EOF || err == SPNG_EIDAT_TOO_SHORT) {
    return "truncated file (" + what + ")";
  }
  return what;
}

// 16-bit samples (big-endian, as SPNG_FMT_RAW leaves them) -> RGB, exactly as PIL does it:
// PIL unpacks RGB, RGBA and grey+alpha 16-bit PNGs with its ";16B" raw modes, which keep the most
// significant byte; 16-bit grey opens as mode "I;16", whose convert("RGB") CLIPS to 255 (values
// >= 256 become 255, so most 16-bit grey images come out nearly white). We match both.
void convert_16bit(const uint8_t* raw, int64_t n_pixels, uint8_t color_type, uint8_t* rgb) {
  switch (color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
      for (int64_t i = 0; i < n_pixels; ++i, raw += 2, rgb += 3) {
        const uint8_t v = raw[0] ? 255 : raw[1];
        rgb[0] = rgb[1] = rgb[2] = v;
      }
      break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      for (int64_t i = 0; i < n_pixels; ++i, raw += 4, rgb += 3) rgb[0] = rgb[1] = rgb[2] = raw[0];
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR:
      for (int64_t i = 0; i < n_pixels; ++i, raw += 6, rgb += 3) {
        rgb[0] = raw[0];
        rgb[1] = raw[2];
        rgb[2] = raw[4];
      }
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
      for (int64_t i = 0; i < n_pixels; ++i, raw += 8, rgb += 3) {
        rgb[0] = raw[0];
        rgb[1] = raw[2];
        rgb[2] = raw[4];
      }
      break;
  }
}

}  // namespace

Result<Image> decode_png(const uint8_t* data, size_t size, const ImageDecodeLimits& limits) {
  std::unique_ptr<spng_ctx, SpngDeleter> ctx(spng_ctx_new(0));
  if (!ctx) return Status(StatusCode::kUnavailable, "PNG: cannot create decoder");

  // spng's own guards, in case a caller raises our limits: PNG caps sides at 2^31 - 1; no chunk
  // can be longer than the input; decompressed ancillary data (iCCP, zTXt...) is capped too.
  const auto cap_u32 = [](int64_t v) {
    return static_cast<uint32_t>(std::clamp<int64_t>(v, 1, std::numeric_limits<int32_t>::max()));
  };
  const size_t chunk_cap = std::max<size_t>(size, 1);
  if (spng_set_image_limits(ctx.get(), cap_u32(limits.max_side), cap_u32(limits.max_side)) != 0 ||
      spng_set_chunk_limits(ctx.get(), chunk_cap, std::max<size_t>(chunk_cap, 16 << 20)) != 0) {
    return internal_error("PNG: cannot set decoder limits");
  }
  // A bad CRC is an error in every chunk spng reads. PIL checks the chunks before the image data
  // too but never the IDAT CRCs; spng checks all IDATs but the last (it stops once the image is
  // complete). So a file whose only fault is the CRC of a non-final IDAT is refused here and
  // decoded by PIL: a deliberate, documented strictness (docs/image_decoding.md).
  spng_set_crc_action(ctx.get(), SPNG_CRC_ERROR, SPNG_CRC_ERROR);
  int err = spng_set_png_buffer(ctx.get(), data, size);
  if (err != 0) return format_error(kFmt, "cannot read input: " + spng_message(err));

  spng_ihdr ihdr{};
  err = spng_get_ihdr(ctx.get(), &ihdr);
  if ((err == SPNG_EUSER_WIDTH || err == SPNG_EUSER_HEIGHT) && size >= 24) {
    // spng parsed IHDR (signature + length + type precede it) and refused the size: report it
    // in the same words as every other format.
    VLM_RETURN_IF_ERROR(check_dimensions(kFmt, read_be32(data + 16), read_be32(data + 20), limits));
  }
  if (err != 0) return format_error(kFmt, "cannot read header: " + spng_message(err));
  VLM_RETURN_IF_ERROR(check_dimensions(kFmt, ihdr.width, ihdr.height, limits));
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, ihdr.width, ihdr.height));
  const int64_t n_pixels = img.width * img.height;

  if (ihdr.bit_depth == 16) {
    // spng's RGB8 would scale 16-bit grey; PIL clips it (see convert_16bit), so take raw samples.
    size_t raw_size = 0;
    err = spng_decoded_image_size(ctx.get(), SPNG_FMT_RAW, &raw_size);
    if (err != 0) return format_error(kFmt, "cannot size image: " + spng_message(err));
    std::unique_ptr<uint8_t[]> raw(new (std::nothrow) uint8_t[raw_size]);
    if (!raw) return Status(StatusCode::kUnavailable, "PNG: out of memory (16-bit)");
    err = spng_decode_image(ctx.get(), raw.get(), raw_size, SPNG_FMT_RAW, 0);
    if (err != 0) return format_error(kFmt, "cannot decode image data: " + spng_message(err));
    convert_16bit(raw.get(), n_pixels, ihdr.color_type, img.rgb.data());
    return img;
  }
  // 1-8 bit: spng expands palettes through PLTE, scales low-bit grey like PIL's L;1/L;2/L;4
  // unpackers (bit replication), and drops alpha. Flags = 0 ignores tRNS and gAMA, as PIL does.
  err = spng_decode_image(ctx.get(), img.rgb.data(), img.rgb.size(), SPNG_FMT_RGB8, 0);
  if (err != 0) return format_error(kFmt, "cannot decode image data: " + spng_message(err));
  return img;
}

}  // namespace vlm::image_decode_internal
