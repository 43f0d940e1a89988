// BMP via stb_image (Debian's libstb-dev ships the header; its compiled libstb is not linked, so
// the implementation is compiled here, BMP-only and with internal linkage).
//
// stb trusts the file more than we want: it pads a short file with zero bytes instead of failing,
// and reads palette entries it never filled when an index or the pixel-data offset is out of range.
// So a small header check runs first: dimensions against the limits, RLE refused by name, the
// pixel data required to be present, and palette indices required to be inside the palette.
// RLE8 and RLE4, which stb does not read, are decoded here.
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "vision/image_decode.h"

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC  // our private copy: no clash if libstb.so is ever linked too
#define STBI_ONLY_BMP
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#define STBI_NO_FAILURE_STRINGS  // our header check gives the useful messages
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"  // the static API we do not call
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace vlm::image_decode_internal {

namespace {

constexpr ImageFormat kFmt = ImageFormat::kBmp;

uint32_t le16(const uint8_t* p) { return p[0] | (uint32_t{p[1]} << 8); }
uint32_t le32(const uint8_t* p) { return le16(p) | (le16(p + 2) << 16); }

struct StbFree {
  void operator()(stbi_uc* p) const { stbi_image_free(p); }
};

// What the header check learns. Offsets and sizes are those stb itself will use.
struct BmpLayout {
  int64_t width = 0;
  int64_t height = 0;  // absolute value; negative in the file means top-down rows
  int bpp = 0;
  int64_t data_offset = 0;
  int64_t row_bytes = 0;            // including the padding to 4 bytes
  int64_t palette_size = 0;         // entries, for bpp <= 8
  int channel_bits[3] = {8, 8, 8};  // R, G, B mask widths; 5 or 6 for 16-bit files
  uint32_t header_size = 0;
  uint32_t compression = 0;  // 1: RLE8, 2: RLE4 (decoded here, not by stb)
  bool top_down = false;
};

Result<BmpLayout> check_bmp_header(const uint8_t* data, size_t size,
                                   const ImageDecodeLimits& limits) {
  // 14-byte file header, then an info header whose first field is its own size.
  if (size < 26) return format_error(kFmt, "truncated header (" + std::to_string(size) + " bytes)");
  BmpLayout l;
  l.data_offset = le32(data + 10);
  const uint32_t hsz = le32(data + 14);
  uint32_t compression = 0;
  if (hsz == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit unsigned sides
    l.width = le16(data + 18);
    l.height = le16(data + 20);
    l.bpp = static_cast<int>(le16(data + 24));
  } else if (hsz == 40 || hsz == 52 || hsz == 56 || hsz == 64 || hsz == 108 || hsz == 124) {
    if (size < 14 + static_cast<size_t>(hsz)) return format_error(kFmt, "truncated header");
    l.width = static_cast<int32_t>(le32(data + 18));
    l.top_down = static_cast<int32_t>(le32(data + 22)) < 0;
    l.height = std::llabs(static_cast<int32_t>(le32(data + 22)));
    l.bpp = static_cast<int>(le16(data + 28));
    compression = le32(data + 30);
  } else {
    return format_error(kFmt, "unsupported header size " + std::to_string(hsz));
  }
  VLM_RETURN_IF_ERROR(check_dimensions(kFmt, l.width, l.height, limits));
  l.header_size = hsz;
  l.compression = compression;
  if (compression == 1 || compression == 2) {
    if ((compression == 1 && l.bpp != 8) || (compression == 2 && l.bpp != 4)) {
      return format_error(kFmt, std::string(compression == 1 ? "RLE8" : "RLE4") +
                                    " compression with " + std::to_string(l.bpp) +
                                    " bits per pixel is invalid");
    }
    if (l.top_down) return format_error(kFmt, "a top-down RLE-compressed BMP is invalid");
    return l;  // the RLE stream is read (and checked) as it is decoded
  }
  if (compression != 0 && compression != 3) {
    return format_error(kFmt, "unsupported compression " + std::to_string(compression));
  }
  if (l.bpp != 1 && l.bpp != 4 && l.bpp != 8 && l.bpp != 16 && l.bpp != 24 && l.bpp != 32) {
    return format_error(kFmt, "unsupported bit depth " + std::to_string(l.bpp));
  }
  // stb reads neither the 52-byte (V2) and 64-byte (OS/2 2.x) headers nor pixel data that does
  // not follow the headers directly (a palette before 16/24/32-bit data); 24- and 32-bit BI_RGB
  // rows are then read here (see decode_bgr), anything else is refused by name.
  const int64_t masks_after = compression == 3 && hsz == 40 ? 12 : 0;
  const bool direct = l.data_offset == 14 + static_cast<int64_t>(hsz) + masks_after;
  if (l.bpp >= 16 && (!direct || hsz == 52 || hsz == 64) &&
      !(compression == 0 && (l.bpp == 24 || l.bpp == 32))) {
    return format_error(kFmt, std::to_string(l.bpp) + "-bit pixel data " +
                                  (direct ? "after a " + std::to_string(hsz) + "-byte header"
                                          : std::string("that does not follow the headers")) +
                                  " is not supported");
  }
  if (l.bpp <= 8 && (hsz == 52 || hsz == 64)) {
    return format_error(
        kFmt, "a palette image with a " + std::to_string(hsz) + "-byte header is not supported");
  }
  if (l.bpp == 16) {
    // BI_RGB is 5-5-5; BI_BITFIELDS masks follow the 40-byte header or sit inside V4/V5 ones,
    // at the same offset either way.
    uint32_t masks[3] = {0x7C00, 0x03E0, 0x001F};
    if (compression == 3) {
      if (hsz == 12 || size < 66) return format_error(kFmt, "truncated bit-field masks");
      for (int c = 0; c < 3; ++c) masks[c] = le32(data + 54 + 4 * c);
    }
    for (int c = 0; c < 3; ++c) l.channel_bits[c] = std::popcount(masks[c]);
  }
  l.row_bytes = (l.width * l.bpp + 31) / 32 * 4;
  if (l.bpp <= 8) {
    // stb's rule: the palette fills the gap between the headers and the pixel data.
    const int64_t gap = l.data_offset - 14 - hsz;
    l.palette_size = hsz == 12 ? (l.data_offset - 14 - 24) / 3 : gap / 4;
    if (gap < 0 || l.palette_size < 1 || l.palette_size > 256) {
      return format_error(
          kFmt, "invalid palette (pixel data offset " + std::to_string(l.data_offset) + ")");
    }
  }
  const int64_t need = l.data_offset + l.row_bytes * l.height;  // sides <= max_side: no overflow
  if (l.data_offset < 14 + static_cast<int64_t>(hsz) || need > static_cast<int64_t>(size)) {
    return format_error(kFmt, "truncated file (pixel data needs " + std::to_string(need) +
                                  " bytes, file has " + std::to_string(size) + ")");
  }
  return l;
}

// Every index must name a palette entry (1-bit images with a 1-entry palette included).
Status check_palette_indices(const uint8_t* data, const BmpLayout& l) {
  if (l.palette_size >= (int64_t{1} << l.bpp)) return ok_status();
  for (int64_t y = 0; y < l.height; ++y) {
    const uint8_t* row = data + l.data_offset + y * l.row_bytes;
    for (int64_t x = 0; x < l.width; ++x) {
      const int64_t bit = x * l.bpp;
      const int v = (row[bit / 8] >> (8 - l.bpp - static_cast<int>(bit % 8))) & ((1 << l.bpp) - 1);
      if (v >= l.palette_size) {
        return format_error(kFmt, "palette index " + std::to_string(v) +
                                      " out of range (palette has " +
                                      std::to_string(l.palette_size) + " colours)");
      }
    }
  }
  return ok_status();
}

// stb widens an n-bit channel by bit replication ((v << 3) | (v >> 2) for 5 bits); PIL's BGR;15
// and BGR;16 unpackers compute v * 255 / (2^n - 1), rounding down, which is up to 1 lower. The top
// n bits of stb's byte are v, so a table maps one to the other exactly.
void rescale_like_pil(const BmpLayout& l, uint8_t* rgb, int64_t n_pixels) {
  uint8_t lut[3][256];
  bool any = false;
  for (int c = 0; c < 3; ++c) {
    const int bits = l.channel_bits[c];
    for (int s = 0; s < 256; ++s) {
      lut[c][s] = (bits == 5 || bits == 6)
                      ? static_cast<uint8_t>((s >> (8 - bits)) * 255 / ((1 << bits) - 1))
                      : static_cast<uint8_t>(s);
    }
    any = any || bits == 5 || bits == 6;
  }
  if (!any) return;
  for (int64_t i = 0; i < n_pixels; ++i, rgb += 3) {
    for (int c = 0; c < 3; ++c) rgb[c] = lut[c][rgb[c]];
  }
}

// RLE8 / RLE4 (BI_RLE8, BI_RLE4), as PIL's BmpRleDecoder reads them: runs of one index (RLE4:
// two alternating), escapes for end of line (the rest of the row is index 0), end of bitmap,
// delta (skipped pixels are index 0) and absolute runs (padded to a 16-bit boundary of the
// file). Rows are bottom-up. The palette holds biClrUsed entries (else 2^bpp), 4 bytes each;
// an index past it is black. A stream that ends before the last pixel is refused, as PIL does.
Result<Image> decode_rle(const uint8_t* data, size_t size, const BmpLayout& l) {
  const bool rle4 = l.compression == 2;
  const int64_t colors_used = l.header_size >= 40 ? le32(data + 46) : 0;
  const int64_t colors = colors_used > 0 ? colors_used : int64_t{1} << l.bpp;
  const int64_t pal_off = 14 + static_cast<int64_t>(l.header_size);
  if (colors > 256 || pal_off + 4 * colors > static_cast<int64_t>(size)) {
    return format_error(kFmt, "invalid palette (" + std::to_string(colors) + " colours)");
  }
  if (l.data_offset < pal_off || l.data_offset > static_cast<int64_t>(size)) {
    return format_error(kFmt, "invalid pixel data offset " + std::to_string(l.data_offset));
  }
  const int64_t w = l.width, total = l.width * l.height;
  std::vector<uint8_t> idx;
  idx.reserve(static_cast<size_t>(total));
  int64_t x = 0;
  size_t p = static_cast<size_t>(l.data_offset);
  while (static_cast<int64_t>(idx.size()) < total) {
    if (p + 2 > size) break;
    int64_t n = data[p];
    const uint8_t b = data[p + 1];
    p += 2;
    if (n > 0) {  // a run
      n = std::min(n, std::max<int64_t>(0, w - x));
      for (int64_t i = 0; i < n; ++i) idx.push_back(rle4 ? (i % 2 == 0 ? b >> 4 : b & 0x0F) : b);
      x += n;
    } else if (b == 0) {  // end of line
      while (idx.size() % static_cast<size_t>(w) != 0) idx.push_back(0);
      x = 0;
    } else if (b == 1) {  // end of bitmap
      break;
    } else if (b == 2) {  // delta: right, up
      if (p + 2 > size) break;
      const int64_t skip = std::min<int64_t>(total - static_cast<int64_t>(idx.size()),
                                             data[p] + int64_t{data[p + 1]} * w);
      p += 2;
      idx.insert(idx.end(), static_cast<size_t>(skip), 0);
      x = static_cast<int64_t>(idx.size()) % w;
    } else {  // an absolute run of b pixels
      const int64_t count = std::min<int64_t>(total - static_cast<int64_t>(idx.size()), b);
      const size_t bytes = static_cast<size_t>(rle4 ? (count + 1) / 2 : count);
      const size_t got = std::min(bytes, size - p);
      for (size_t i = 0; i < got; ++i) {
        if (rle4) {
          idx.push_back(data[p + i] >> 4);
          if (static_cast<int64_t>(i) * 2 + 1 < count) idx.push_back(data[p + i] & 0x0F);
        } else {
          idx.push_back(data[p + i]);
        }
      }
      p += got;
      if (got < bytes || static_cast<int64_t>(idx.size()) == total) break;
      x += b;
      if (p % 2 != 0) ++p;  // a 16-bit boundary of the file
    }
  }
  if (static_cast<int64_t>(idx.size()) < total) {
    return format_error(kFmt, std::string(rle4 ? "RLE4" : "RLE8") +
                                  " data ends before the last pixel (truncated file)");
  }
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, l.width, l.height));
  for (int64_t y = 0; y < l.height; ++y) {
    const uint8_t* src = idx.data() + y * w;
    uint8_t* dst = img.rgb.data() + (l.height - 1 - y) * w * 3;  // bottom-up
    for (int64_t i = 0; i < w; ++i) {
      const int64_t k = src[i];
      const uint8_t* c = data + pal_off + 4 * k;
      dst[3 * i] = k < colors ? c[2] : 0;
      dst[3 * i + 1] = k < colors ? c[1] : 0;
      dst[3 * i + 2] = k < colors ? c[0] : 0;
    }
  }
  return img;
}

// 24-bit (BGR) and 32-bit BI_RGB (BGRX: the fourth byte is not alpha) rows from the pixel data
// offset, bottom-up unless the height was negative, as PIL reads them.
Result<Image> decode_bgr(const uint8_t* data, const BmpLayout& l) {
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, l.width, l.height));
  const int step = l.bpp / 8;
  for (int64_t y = 0; y < l.height; ++y) {
    const uint8_t* src = data + l.data_offset + y * l.row_bytes;
    uint8_t* dst = img.rgb.data() + (l.top_down ? y : l.height - 1 - y) * l.width * 3;
    for (int64_t x = 0; x < l.width; ++x, src += step) {
      dst[3 * x] = src[2];
      dst[3 * x + 1] = src[1];
      dst[3 * x + 2] = src[0];
    }
  }
  return img;
}

}  // namespace

Result<Image> decode_bmp(const uint8_t* data, size_t size, const ImageDecodeLimits& limits) {
  VLM_ASSIGN_OR_RETURN(BmpLayout layout, check_bmp_header(data, size, limits));
  if (layout.compression == 1 || layout.compression == 2) return decode_rle(data, size, layout);
  const int64_t masks_after = layout.compression == 3 && layout.header_size == 40 ? 12 : 0;
  const bool direct =
      layout.data_offset == 14 + static_cast<int64_t>(layout.header_size) + masks_after;
  if (layout.bpp >= 24 && layout.compression == 0 &&
      (!direct || layout.header_size == 52 || layout.header_size == 64)) {
    return decode_bgr(data, layout);
  }
  if (layout.bpp <= 8) VLM_RETURN_IF_ERROR(check_palette_indices(data, layout));
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return format_error(kFmt, "file too large for the decoder");
  }
  int w = 0, h = 0, channels = 0;
  // stb allocates its own buffer (it cannot decode into ours), so BMP costs one extra copy.
  std::unique_ptr<stbi_uc, StbFree> pixels(
      stbi_load_from_memory(data, static_cast<int>(size), &w, &h, &channels, 3));
  if (!pixels) return format_error(kFmt, "corrupt or unsupported file");
  if (w != layout.width || h != layout.height) {
    return internal_error("BMP: decoder disagrees with the header about the image size");
  }
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, w, h));
  std::memcpy(img.rgb.data(), pixels.get(), img.rgb.size());
  if (layout.bpp == 16) rescale_like_pil(layout, img.rgb.data(), img.width * img.height);
  return img;
}

}  // namespace vlm::image_decode_internal
