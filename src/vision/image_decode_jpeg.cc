// JPEG via libjpeg-turbo's TurboJPEG API: the same decoder PIL uses (Pillow bundles libjpeg-turbo),
// with the same settings (accurate integer IDCT, fancy upsampling), so pixels match PIL exactly.
// TurboJPEG catches libjpeg's error_exit with its own setjmp inside each call and returns -1, so no
// longjmp ever crosses our frames.
#include <turbojpeg.h>

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "vision/image_decode.h"

namespace vlm::image_decode_internal {

namespace {

constexpr ImageFormat kFmt = ImageFormat::kJpeg;

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

std::string tj_message(tjhandle h) { return tjGetErrorStr2(h); }

// PIL opens every 4-component JPEG (CMYK or YCCK) as mode "CMYK" with rawmode "CMYK;I", i.e. it
// assumes Adobe's inverted polarity and stores 255 - v, then Image.convert("RGB") applies
// cmyk2rgb from Pillow's Convert.c: nk = 255 - K, R = clip(nk - muldiv255(C, nk)), where
// muldiv255(a, b) = (t + (t >> 8)) >> 8 with t = a * b + 128. Substituting C = 255 - c and
// K = 255 - k (c, k as libjpeg returns them) gives the loop below.
void cmyk_to_rgb(const uint8_t* cmyk, int64_t n_pixels, uint8_t* rgb) {
  for (int64_t i = 0; i < n_pixels; ++i, cmyk += 4, rgb += 3) {
    const int nk = cmyk[3];  // 255 - (255 - k)
    for (int c = 0; c < 3; ++c) {
      const int t = (255 - cmyk[c]) * nk + 128;
      const int v = nk - ((t + (t >> 8)) >> 8);
      rgb[c] = static_cast<uint8_t>(v < 0 ? 0 : v);  // v <= nk <= 255 always
    }
  }
}

// After tjDecompress2 returns -1, says whether libjpeg only warned and finished the image.
// tjGetErrorCode() cannot tell: it reports TJERR_WARNING whenever any warning was emitted, even if
// a fatal error followed (a truncated progressive file warns "Premature end" and then fails with
// "Bogus Huffman table definition"). The text can: a fatal error replaces it, while a warning-only
// run keeps the first warning's text. These are libjpeg's JWRN_* messages, on which PIL (whose
// libjpeg error manager only logs warnings) still returns an image. "Premature end of JPEG file"
// is not among them: PIL refuses truncated files ("image file is truncated"), and so do we.
bool is_benign_warning(const std::string& msg) {
  for (const char* prefix :
       {"Corrupt JPEG data", "Warning: unknown JFIF revision", "Inconsistent progression sequence",
        "Unknown Adobe color transform", "Invalid SOS parameters for sequential JPEG"}) {
    if (msg.starts_with(prefix)) return true;
  }
  return false;
}

}  // namespace

Result<Image> decode_jpeg(const uint8_t* data, size_t size, const ImageDecodeLimits& limits) {
  TjHandle tj(tjInitDecompress());
  if (!tj) {
    return internal_error(std::string("JPEG: cannot create decoder: ") + tjGetErrorStr2(nullptr));
  }
  // TurboJPEG takes a non-const pointer and an unsigned long size but never writes the input.
  auto* src = const_cast<unsigned char*>(data);
  const auto src_size = static_cast<unsigned long>(size);

  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.get(), src, src_size, &width, &height, &subsamp, &colorspace) != 0) {
    // Stray bytes before a marker (cameras, Photoshop) make libjpeg warn while the header is
    // read; the header is complete then, and PIL decodes such files. Other failures are fatal.
    const std::string msg = tj_message(tj.get());
    if (!(is_benign_warning(msg) && width > 0 && height > 0)) {
      return format_error(kFmt, "cannot read header (truncated or corrupt file?): " + msg);
    }
  }
  VLM_RETURN_IF_ERROR(check_dimensions(kFmt, width, height, limits));
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, width, height));

  // ACCURATEDCT = libjpeg's JDCT_ISLOW, PIL's default; fancy upsampling stays on (PIL's default).
  // LIMITSCANS rejects progressive files with > 500 scans, a known CPU-exhaustion attack.
  const int flags = TJFLAG_ACCURATEDCT | TJFLAG_LIMITSCANS;
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  std::unique_ptr<uint8_t[]> cmyk_buf;
  int rc = 0;
  if (cmyk) {
    // libjpeg cannot convert CMYK to RGB itself; decode to CMYK and apply PIL's formula.
    cmyk_buf.reset(new (std::nothrow) uint8_t[static_cast<size_t>(width) * height * 4]);
    if (!cmyk_buf) return Status(StatusCode::kUnavailable, "JPEG: out of memory (CMYK)");
    rc = tjDecompress2(tj.get(), src, src_size, cmyk_buf.get(), width, width * 4, height, TJPF_CMYK,
                       flags);
  } else {
    // Grey, YCbCr and RGB JPEGs: libjpeg converts straight into the final buffer.
    rc = tjDecompress2(tj.get(), src, src_size, img.rgb.data(), width, width * 3, height, TJPF_RGB,
                       flags);
  }
  if (rc != 0) {
    const std::string msg = tj_message(tj.get());
    if (msg.starts_with("Premature end of JPEG file")) {
      return format_error(kFmt, "truncated file (" + msg + ")");
    }
    if (!is_benign_warning(msg)) return format_error(kFmt, "cannot decode image data: " + msg);
  }
  if (cmyk) cmyk_to_rgb(cmyk_buf.get(), static_cast<int64_t>(width) * height, img.rgb.data());
  return img;
}

}  // namespace vlm::image_decode_internal
