// GIF via giflib (the long-standing reference decoder; returns error codes, never longjmps). Only
// the first frame is decoded, composed on the logical screen the way PIL builds frame 0.
#include <gif_lib.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "vision/image_decode.h"

namespace vlm::image_decode_internal {

namespace {

constexpr ImageFormat kFmt = ImageFormat::kGif;

struct MemoryReader {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

// giflib's input callback: copies up to n bytes; a short count makes giflib report a read error.
int read_memory(GifFileType* gif, GifByteType* out, int n) {
  auto* r = static_cast<MemoryReader*>(gif->UserData);
  if (n <= 0) return 0;
  const size_t k = std::min(static_cast<size_t>(n), r->size - r->pos);
  std::memcpy(out, r->data + r->pos, k);
  r->pos += k;
  return static_cast<int>(k);
}

struct GifCloser {
  void operator()(GifFileType* gif) const {
    int err = 0;
    DGifCloseFile(gif, &err);
  }
};
using GifPtr = std::unique_ptr<GifFileType, GifCloser>;

std::string gif_error(int code) {
  const char* s = GifErrorString(code);
  std::string what = s ? s : "error " + std::to_string(code);
  if (code == D_GIF_ERR_READ_FAILED) what += " (truncated or corrupt file?)";
  return what;
}

// PIL's GifImagePlugin ignores a colour table that is the identity grey ramp (entry i = (i, i, i))
// ("_is_palette_needed").
bool palette_needed(const ColorMapObject* map) {
  if (map == nullptr) return false;
  for (int i = 0; i < map->ColorCount; ++i) {
    const GifColorType& c = map->Colors[i];
    if (c.Red != i || c.Green != i || c.Blue != i) return true;
  }
  return false;
}

// Index -> RGB, as PIL's frame 0 ends up after convert("RGB") (checked against Pillow 13 for each
// case): the local table if it is "needed", else the global one if it is; indices past the end
// of the chosen table are black. With neither, PIL opens the frame as mode "L" and every index is
// its own grey level.
std::array<uint8_t, 256 * 3> make_lut(const ColorMapObject* local, const ColorMapObject* global) {
  const ColorMapObject* map = palette_needed(local)    ? local
                              : palette_needed(global) ? global
                                                       : nullptr;
  std::array<uint8_t, 256 * 3> lut;
  const int n = map ? std::clamp(map->ColorCount, 0, 256) : 0;
  for (int i = 0; i < 256; ++i) {
    uint8_t* e = &lut[i * 3];
    if (map == nullptr) {
      e[0] = e[1] = e[2] = static_cast<uint8_t>(i);
    } else if (i < n) {
      e[0] = map->Colors[i].Red;
      e[1] = map->Colors[i].Green;
      e[2] = map->Colors[i].Blue;
    } else {
      e[0] = e[1] = e[2] = 0;
    }
  }
  return lut;
}

}  // namespace

Result<Image> decode_gif(const uint8_t* data, size_t size, const ImageDecodeLimits& limits) {
  MemoryReader reader{data, size, 0};
  int err = 0;
  // DGifOpen reads the screen descriptor and global colour table only.
  GifPtr gif(DGifOpen(&reader, read_memory, &err));
  if (!gif) return format_error(kFmt, "cannot read header: " + gif_error(err));
  // The logical screen is the canvas; check it before reading further.
  VLM_RETURN_IF_ERROR(
      check_dimensions(kFmt, std::max(gif->SWidth, 1), std::max(gif->SHeight, 1), limits));

  int transparent = -1;  // from a Graphic Control Extension before the first image
  for (;;) {
    GifRecordType type = UNDEFINED_RECORD_TYPE;
    if (DGifGetRecordType(gif.get(), &type) == GIF_ERROR) {
      return format_error(kFmt, "cannot read record: " + gif_error(gif->Error));
    }
    if (type == TERMINATE_RECORD_TYPE) return format_error(kFmt, "file contains no image");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* block = nullptr;
      if (DGifGetExtension(gif.get(), &code, &block) == GIF_ERROR) {
        return format_error(kFmt, "cannot read extension: " + gif_error(gif->Error));
      }
      // block[0] is the sub-block length; GCE = flags, delay (2), transparent index.
      if (code == GRAPHICS_EXT_FUNC_CODE && block && block[0] >= 4 && (block[1] & 1)) {
        transparent = block[4];
      }
      while (block) {
        if (DGifGetExtensionNext(gif.get(), &block) == GIF_ERROR) {
          return format_error(kFmt, "cannot read extension: " + gif_error(gif->Error));
        }
      }
      continue;
    }
    if (type == IMAGE_DESC_RECORD_TYPE) break;
  }
  if (DGifGetImageDesc(gif.get()) == GIF_ERROR) {
    // giflib reads the LZW minimum code size last and refuses one above 8 as a read failure:
    // say what it is.
    if (gif->Error == D_GIF_ERR_READ_FAILED && reader.pos > 0 && reader.pos < reader.size &&
        reader.data[reader.pos - 1] > 8) {
      return format_error(kFmt, "invalid LZW minimum code size " +
                                    std::to_string(reader.data[reader.pos - 1]) +
                                    " (GIF allows at most 8)");
    }
    return format_error(kFmt, "cannot read image descriptor: " + gif_error(gif->Error));
  }
  const GifImageDesc& desc = gif->Image;
  // PIL grows the canvas when frame 0 reaches past the logical screen (all values are 16-bit).
  const int64_t width = std::max<int64_t>(gif->SWidth, int64_t{desc.Left} + desc.Width);
  const int64_t height = std::max<int64_t>(gif->SHeight, int64_t{desc.Top} + desc.Height);
  VLM_RETURN_IF_ERROR(check_dimensions(kFmt, width, height, limits));
  VLM_ASSIGN_OR_RETURN(Image img, allocate_image(kFmt, width, height));

  // Palette indices for the whole canvas. PIL starts frame 0 as a "P" image filled with the
  // transparent index when there is one, else 0; transparent pixels inside the frame keep their
  // index (convert("RGB") shows the table colour, not a background).
  const size_t n_pixels = static_cast<size_t>(width) * static_cast<size_t>(height);
  std::unique_ptr<uint8_t[]> index(new (std::nothrow) uint8_t[n_pixels]);
  if (!index) return Status(StatusCode::kUnavailable, "GIF: out of memory (index buffer)");
  std::memset(index.get(), transparent >= 0 ? transparent : 0, n_pixels);

  // Interlaced frames arrive in four passes: rows 0, 8, 16...; 4, 12...; 2, 6...; 1, 3...
  static constexpr int kStart[4] = {0, 4, 2, 1};
  static constexpr int kStep[4] = {8, 8, 4, 2};
  const int passes = desc.Interlace ? 4 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    const int start = desc.Interlace ? kStart[pass] : 0;
    const int step = desc.Interlace ? kStep[pass] : 1;
    for (int y = start; y < desc.Height && desc.Width > 0; y += step) {
      uint8_t* row = index.get() + (int64_t{desc.Top} + y) * width + desc.Left;
      if (DGifGetLine(gif.get(), row, desc.Width) == GIF_ERROR) {
        // PIL refuses both data that runs out and an LZW end code before the last pixel
        // ("image file is truncated"), so neither yields a partial image here.
        if (gif->Error == D_GIF_ERR_EOF_TOO_SOON) {
          return format_error(kFmt, "image data ends early (" + gif_error(gif->Error) + ")");
        }
        return format_error(kFmt, "cannot decode image data: " + gif_error(gif->Error));
      }
    }
  }

  const std::array<uint8_t, 256 * 3> lut = make_lut(desc.ColorMap, gif->SColorMap);
  uint8_t* out = img.rgb.data();
  for (size_t i = 0; i < n_pixels; ++i, out += 3) std::memcpy(out, &lut[index[i] * 3], 3);
  return img;
}

}  // namespace vlm::image_decode_internal
