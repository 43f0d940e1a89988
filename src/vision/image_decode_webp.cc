// WebP via libwebp (Google's reference decoder, also what Pillow uses): lossy, lossless, alpha.
#include <webp/decode.h>
#include <webp/demux.h>

#include <memory>
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

// An animation's first frame as PIL gives it: libwebpdemux's WebPAnimDecoder composites it onto
// the canvas (the header's size, checked against the limits before this) in RGBA, and
// convert("RGB") drops the alpha.
Result<Image> decode_first_frame(const uint8_t* data, size_t size) {
  WebPAnimDecoderOptions opts;
  if (!WebPAnimDecoderOptionsInit(&opts)) return internal_error("WebP: library version mismatch");
  opts.color_mode = MODE_RGBA;
  opts.use_threads = 0;
  const WebPData wd{data, size};
  std::unique_ptr<WebPAnimDecoder, void (*)(WebPAnimDecoder*)> dec(WebPAnimDecoderNew(&wd, &opts),
                                                                   WebPAnimDecoderDelete);
  if (!dec) return format_error(kFmt, "cannot read the animation (corrupt or truncated file)");
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(dec.get(), &info) || info.frame_count == 0) {
    return format_error(kFmt, "the animation has no frame");
  }
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(dec.get(), &rgba, &timestamp)) {
    return format_error(kFmt, "cannot decode the animation's first frame");
  }
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, static_cast<int64_t>(info.canvas_width),
                                                 static_cast<int64_t>(info.canvas_height)));
  const size_t n = static_cast<size_t>(info.canvas_width) * info.canvas_height;
  for (size_t i = 0; i < n; ++i) {
    img.rgb[3 * i] = rgba[4 * i];
    img.rgb[3 * i + 1] = rgba[4 * i + 1];
    img.rgb[3 * i + 2] = rgba[4 * i + 2];
  }
  return img;
}

}  // namespace

Result<Image> decode_webp(const uint8_t* data, size_t size, const ImageDecodeLimits& limits) {
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return internal_error("WebP: library version mismatch");

  // Parses only the RIFF/VP8X and frame headers: nothing is allocated.
  VP8StatusCode st = WebPGetFeatures(data, size, &config.input);
  if (st != VP8_STATUS_OK) return format_error(kFmt, "cannot read header: " + webp_status(st));
  VLM_RETURN_IF_ERROR(check_dimensions(kFmt, config.input.width, config.input.height, limits));
  if (config.input.has_animation) return decode_first_frame(data, size);
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
