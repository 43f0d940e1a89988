// WebP via libwebp (Google's reference decoder, also what Pillow uses): lossy, lossless, alpha.
#include <webp/decode.h>

#include <string>

#include "vision/image_decode.h"

namespace vlm::image_decode_internal {

namespace {

constexpr ImageFormat kFmt = ImageFormat::kWebp;

std::string webp_status(VP8StatusCode s) {
  switch (s) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "corrupt bitstream";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "decoding suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "truncated file (not enough data)";
  }
  return "unknown error " + std::to_string(static_cast<int>(s));
}

}  // namespace

Result<Image> decode_webp(const uint8_t* data, size_t size, const ImageDecodeLimits& limits) {
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return internal_error("WebP: library version mismatch");

  // Parses only the RIFF/VP8X and frame headers: nothing is allocated.
  VP8StatusCode st = WebPGetFeatures(data, size, &config.input);
  if (st != VP8_STATUS_OK) return format_error(kFmt, "cannot read header: " + webp_status(st));
  if (config.input.has_animation) {
    // NOTE: the first frame of an animation is composited by libwebpdemux's WebPAnimDecoder (what
    // PIL uses), which vlm_vision does not link; refuse clearly rather than guess.
    return format_error(kFmt,
                        "animated WebP is not supported (convert the first frame to a still)");
  }
  VLM_RETURN_IF_ERROR(check_dimensions(kFmt, config.input.width, config.input.height, limits));
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, config.input.width, config.input.height));

  // Decode straight into our buffer. MODE_RGB writes the colour planes and ignores alpha, which is
  // what PIL's convert("RGB") keeps (libwebp's RGBA output is not premultiplied). Default options:
  // fancy upsampling on, no dithering, as in PIL.
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = img.rgb.data();
  config.output.u.RGBA.stride = static_cast<int>(img.width * 3);
  config.output.u.RGBA.size = img.rgb.size();
  st = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);  // frees nothing of ours (external memory); keeps libwebp tidy
  if (st != VP8_STATUS_OK)
    return format_error(kFmt, "cannot decode image data: " + webp_status(st));
  return img;
}

}  // namespace vlm::image_decode_internal
