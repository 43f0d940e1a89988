#!/usr/bin/env python3
"""Build the image-decoding fixtures in tests/unit/fixtures/images/ and their PIL goldens.

What it writes:

* Small images (mostly 37x23, so JPEG MCUs and PNG/BMP rows end mid-block) in every format and
  mode the decoder handles:
  - PNG: RGB, RGBA, grey, grey+alpha, palette (with and without tRNS), 1- and 2-bit grey, 4-bit
    palette, 16-bit RGB/RGBA/grey/grey+alpha, Adam7-interlaced, no IEND, trailing garbage,
    palette indices past the PLTE;
  - JPEG: baseline 4:2:0, 4:2:2 and 4:4:4, progressive, grey, CMYK (Adobe inverted), YCCK, an
    EXIF "rotate 90" tag, extraneous bytes before EOI, trailing garbage, no EOI (refused);
  - WebP: lossy, lossy+alpha, lossless+alpha, animated (refused);
  - GIF: palette, transparency, an interlaced first frame at an offset with a local colour table,
    a frame larger than the screen, the colour-table corner cases, LZW data that ends early
    (refused), an animation;
  - BMP: 1, 8, 16 (5-5-5 and 5-6-5), 24 and 32-bit, top-down.
  Files PIL cannot write (16-bit colour PNG, interlaced PNG, hand-built GIFs, 16-bit BMP) come
  from the small encoders below; the YCCK JPEG from the system's libturbojpeg through ctypes.
* expected.json: for each fixture and for every photo in tests/data/images, what ``PIL.Image.open(f).convert("RGB")`` gives -- width, height, the sum of the
  RGB bytes, the weighted sum  sum(byte[i] * (i % 251 + 1)),  and a few sample pixels -- or, for
  files the decoder must refuse, "expect_error" with the reason.

Usage:
    python scripts/make_image_fixtures.py

Deterministic: fixed seeds, fixed encoder settings. Re-running with the same Pillow/libjpeg-turbo/
libwebp gives the same bytes; the goldens are recomputed from whatever bytes are on disk.
"""

from __future__ import annotations

import io
import json
import struct
import warnings
import sys
import zlib
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "unit" / "fixtures" / "images"
PHOTO_DIR = ROOT / "tests" / "data" / "images"
W, H = 37, 23


def pattern(w: int = W, h: int = H, seed: int = 0) -> np.ndarray:
    """Gradients plus noise plus a hard edge: smooth areas and detail for every codec."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack(
        [x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * 7 + y * 13) % 256], axis=-1
    ).astype(np.int32)
    rgb += rng.integers(-24, 25, rgb.shape)
    rgb[h // 3 : h // 2, w // 4 : w // 2] = [250, 20, 30]
    return np.clip(rgb, 0, 255).astype(np.uint8)


def alpha_plane(w: int = W, h: int = H) -> np.ndarray:
    """All alpha values, including 0 over non-zero colour (which convert("RGB") must keep)."""
    y, x = np.mgrid[0:h, 0:w]
    return ((x * 31 + y * 17) % 256).astype(np.uint8)


# --- PNG writer for what Pillow cannot write (16-bit colour, Adam7) ---------------------------


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bytes(samples: np.ndarray, color_type: int, bit_depth: int, interlace: bool = False,
              extra: bytes = b"", width: int | None = None) -> bytes:
    """samples: [h, w, channels] of uint8/uint16 in the PNG's bit depth (sub-byte depths: rows
    already packed with pack_bits, and `width` giving the width in pixels)."""
    h, w = samples.shape[:2]
    w = width or w
    dtype = ">u2" if bit_depth == 16 else "u1"

    def rows(img: np.ndarray) -> bytes:
        return b"".join(b"\x00" + img[r].astype(dtype).tobytes() for r in range(img.shape[0]))

    if interlace:
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
                  (1, 0, 2, 2), (0, 1, 1, 2)]
        raw = b"".join(
            rows(samples[y0::dy, x0::dx]) for x0, y0, dx, dy in passes
            if samples[y0::dy, x0::dx].size
        )
    else:
        raw = rows(samples)
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra +
            png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b""))


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """[h, w] small ints -> [h, ceil(w*bits/8)] bytes, MSB first, as PNG stores them."""
    h, w = values.shape
    per = 8 // bits
    padded = np.zeros((h, (w + per - 1) // per * per), np.uint8)
    padded[:, :w] = values
    grouped = padded.reshape(h, -1, per)
    out = np.zeros(grouped.shape[:2], np.uint8)
    for k in range(per):
        out |= (grouped[:, :, k] << (8 - bits * (k + 1))).astype(np.uint8)
    return out


# --- GIF writer (hand-built so a frame can sit at an offset, be interlaced, end early) ---------


def lzw_codes(indices: list[int], min_code_size: int, stop_after: int | None = None) -> bytes:
    """Literal-only LZW with a clear code often enough that codes never outgrow min+1 bits."""
    clear, eoi = 1 << min_code_size, (1 << min_code_size) + 1
    width = min_code_size + 1
    per_clear = (1 << width) - (clear + 2) - 4
    codes = []
    for n, v in enumerate(indices if stop_after is None else indices[:stop_after]):
        if n % per_clear == 0:
            codes.append(clear)
        codes.append(v)
    codes.append(eoi)
    acc = nbits = 0
    out = bytearray()
    for c in codes:
        acc |= c << nbits
        nbits += width
        while nbits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            nbits -= 8
    if nbits:
        out.append(acc & 0xFF)
    blocks = bytearray([min_code_size])
    for i in range(0, len(out), 255):
        part = out[i : i + 255]
        blocks += bytes([len(part)]) + part
    return bytes(blocks + b"\x00")


def gif_frame(idx: np.ndarray, left: int, top: int, palette: np.ndarray | None, interlace: bool,
              transparent: int | None, stop_after: int | None = None) -> bytes:
    h, w = idx.shape
    out = b""
    if transparent is not None:
        out += b"!\xf9\x04" + bytes([1, 0, 0, transparent]) + b"\x00"
    flags = 0x40 if interlace else 0
    if palette is not None:
        bits = int(np.log2(len(palette)))
        flags |= 0x80 | (bits - 1)
    out += b"," + struct.pack("<HHHHB", left, top, w, h, flags)
    if palette is not None:
        out += palette.astype(np.uint8).tobytes()
    rows = list(range(h))
    if interlace:
        rows = (list(range(0, h, 8)) + list(range(4, h, 8)) + list(range(2, h, 4)) +
                list(range(1, h, 2)))
    flat = [int(v) for r in rows for v in idx[r]]
    return out + lzw_codes(flat, 8, stop_after)


def gif_bytes(screen_w: int, screen_h: int, global_palette: np.ndarray | None,
              frames: list[bytes]) -> bytes:
    flags = 0
    if global_palette is not None:
        flags = 0x80 | 0x70 | (int(np.log2(len(global_palette))) - 1)
    out = b"GIF89a" + struct.pack("<HHBBB", screen_w, screen_h, flags, 0, 0)
    if global_palette is not None:
        out += global_palette.astype(np.uint8).tobytes()
    return out + b"".join(frames) + b";"


def bmp_rle_bytes(w: int, h: int, rle4: bool, stream: bytes, palette: np.ndarray) -> bytes:
    """BI_RLE8 / BI_RLE4 BMP (bottom-up) with a 40-byte header and a BGRX palette."""
    pal = b"".join(bytes([int(c[2]), int(c[1]), int(c[0]), 0]) for c in palette)
    offset = 14 + 40 + len(pal)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 4 if rle4 else 8, 2 if rle4 else 1,
                       len(stream), 2835, 2835, len(palette), 0)
    head = b"BM" + struct.pack("<IHHI", offset + len(stream), 0, 0, offset)
    return head + info + pal + stream


def bmp16_bytes(pixels: np.ndarray, masks: tuple[int, int, int] | None) -> bytes:
    """16-bit BMP, bottom-up; BI_BITFIELDS with `masks`, else BI_RGB (5-5-5)."""
    h, w = pixels.shape
    stride = (w * 2 + 3) // 4 * 4
    rows = b"".join(pixels[r].astype("<u2").tobytes().ljust(stride, b"\0")
                    for r in range(h - 1, -1, -1))
    extra = struct.pack("<III", *masks) if masks else b""
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 16, 3 if masks else 0, len(rows), 2835, 2835,
                       0, 0)
    offset = 14 + len(info) + len(extra)
    return b"BM" + struct.pack("<IHHI", offset + len(rows), 0, 0, offset) + info + extra + rows


# --- YCCK JPEG (Photoshop's usual CMYK encoding), which Pillow cannot write ----------------------


def ycck_jpeg(cmyk: np.ndarray, quality: int = 90) -> bytes | None:
    """TurboJPEG compresses packed CMYK as YCCK (Adobe transform 2). None if libturbojpeg is
    missing, in which case the fixture already on disk is kept."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    try:
        tj = ctypes.CDLL(name)
    except OSError:
        return None
    tj.tjInitCompress.restype = ctypes.c_void_p
    tj.tjCompress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                               ctypes.POINTER(ctypes.c_ulong), ctypes.c_int, ctypes.c_int,
                               ctypes.c_int]
    tj.tjFree.argtypes = [ctypes.c_void_p]
    tj.tjDestroy.argtypes = [ctypes.c_void_p]
    h, w = cmyk.shape[:2]
    handle = tj.tjInitCompress()
    buf, size = ctypes.c_void_p(), ctypes.c_ulong(0)
    TJPF_CMYK, TJSAMP_420 = 11, 2
    rc = tj.tjCompress2(handle, np.ascontiguousarray(cmyk).tobytes(), w, 0, h, TJPF_CMYK,
                        ctypes.byref(buf), ctypes.byref(size), TJSAMP_420, quality, 0)
    data = ctypes.string_at(buf, size.value) if rc == 0 else None
    tj.tjFree(buf)
    tj.tjDestroy(handle)
    return data


# --- the fixtures -------------------------------------------------------------------------------


def save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def make_fixtures() -> dict[str, bytes]:
    rgb = pattern()
    a = alpha_plane()
    grey = rgb[..., 1]
    rgba = np.dstack([rgb, a])
    im_rgb = Image.fromarray(rgb, "RGB")
    im_rgba = Image.fromarray(rgba, "RGBA")
    im_grey = Image.fromarray(grey, "L")
    im_p = im_rgb.quantize(colors=61, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    rng = np.random.default_rng(7)
    f: dict[str, bytes] = {}

    # PNG
    f["png_rgb.png"] = save(im_rgb, "PNG")
    f["png_rgba.png"] = save(im_rgba, "PNG")
    f["png_grey.png"] = save(im_grey, "PNG")
    f["png_grey_alpha.png"] = save(Image.fromarray(np.dstack([grey, a]), "LA"), "PNG")
    f["png_palette.png"] = save(im_p, "PNG")
    f["png_palette_trns.png"] = save(im_p, "PNG", transparency=bytes(range(0, 244, 4)))
    f["png_grey_trns.png"] = save(im_grey, "PNG", transparency=int(grey[0, 0]))
    f["png_grey_1bit.png"] = png_bytes(pack_bits(grey >> 7, 1)[..., None], 0, 1, width=W)
    f["png_grey_2bit.png"] = png_bytes(pack_bits(grey >> 6, 2)[..., None], 0, 2, width=W)
    f["png_palette_4bit.png"] = (  # 16-entry palette, 4-bit indices
        lambda idx: png_bytes(pack_bits(idx, 4)[..., None], 3, 4, width=W, extra=png_chunk(
            b"PLTE", rng.integers(0, 256, (16, 3)).astype(np.uint8).tobytes())))(grey >> 4)
    wide = rgb.astype(np.uint16) * 257 + rng.integers(0, 257, rgb.shape).astype(np.uint16)
    f["png_rgb16.png"] = png_bytes(wide, 2, 16)
    f["png_rgba16.png"] = png_bytes(np.dstack([wide, a.astype(np.uint16) * 257]), 6, 16)
    # 16-bit grey: half the values below 256 so PIL's clipping to 255 shows both ways.
    grey16 = np.where(np.arange(W)[None, :] % 2 == 0, grey.astype(np.uint16),
                      grey.astype(np.uint16) * 257).astype(np.uint16)
    f["png_grey16.png"] = png_bytes(grey16[..., None], 0, 16)
    f["png_grey_alpha16.png"] = png_bytes(np.dstack([grey16, a.astype(np.uint16) * 257]), 4, 16)
    png = f["png_rgb.png"]
    f["png_no_iend.png"] = png[:-12]  # both PIL and spng stop once the image data is complete
    f["png_trailing_garbage.png"] = png + b"not part of the image" * 4
    # Indices past the end of a 4-entry PLTE: PIL gives black, as does spng.
    oob = ((np.arange(W)[None, :] * 7 + np.arange(H)[:, None] * 29) % 256).astype(np.uint8)
    f["png_palette_out_of_range.png"] = png_bytes(
        oob[..., None], 3, 8, extra=png_chunk(b"PLTE", bytes(range(12))))
    f["png_rgb_interlaced.png"] = png_bytes(rgb, 2, 8, interlace=True)
    f["png_palette_interlaced.png"] = png_bytes(
        np.asarray(im_p)[..., None], 3, 8, interlace=True,
        extra=png_chunk(b"PLTE", bytes(im_p.getpalette()[: 3 * 61])))

    # JPEG (PIL's libjpeg-turbo; quality and sampling chosen to exercise every upsampler)
    f["jpeg_baseline_420.jpg"] = save(im_rgb, "JPEG", quality=85, subsampling="4:2:0")
    f["jpeg_baseline_422.jpg"] = save(im_rgb, "JPEG", quality=90, subsampling="4:2:2")
    f["jpeg_baseline_444.jpg"] = save(im_rgb, "JPEG", quality=95, subsampling="4:4:4")
    f["jpeg_progressive.jpg"] = save(im_rgb, "JPEG", quality=85, progressive=True)
    f["jpeg_grey.jpg"] = save(im_grey, "JPEG", quality=90)
    cmyk = np.dstack([255 - rgb, (grey // 3).astype(np.uint8)])
    f["jpeg_cmyk.jpg"] = save(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=90)
    ycck = ycck_jpeg(cmyk)
    if ycck is not None:
        f["jpeg_ycck.jpg"] = ycck
    elif (OUT / "jpeg_ycck.jpg").exists():
        f["jpeg_ycck.jpg"] = (OUT / "jpeg_ycck.jpg").read_bytes()
    base = f["jpeg_baseline_420.jpg"]
    # libjpeg warns "Corrupt JPEG data: 3 extraneous bytes before marker 0xd9" and finishes; PIL
    # returns the image, so must we. Bytes after EOI are ignored by both.
    f["jpeg_extraneous_bytes.jpg"] = base[:-2] + b"\x00\x11\x22" + base[-2:]
    f["jpeg_trailing_garbage.jpg"] = base + b"not part of the image" * 4
    f["jpeg_no_eoi.jpg"] = base[:-2]  # PIL: "image file is truncated"
    # Stray bytes before a header marker (cameras and Photoshop write such files): libjpeg warns
    # "Corrupt JPEG data: 3 extraneous bytes before marker 0xdb" while reading the header and
    # PIL returns the image.
    dqt = base.index(b"\xff\xdb")
    f["jpeg_junk_before_dqt.jpg"] = base[:dqt] + b"\x00\x11\x22" + base[dqt:]
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display. PIL.Image.open does not apply it.
    f["jpeg_exif_rotate90.jpg"] = save(im_rgb, "JPEG", quality=85, exif=exif)

    # WebP
    f["webp_lossy.webp"] = save(im_rgb, "WEBP", quality=80, method=4)
    f["webp_lossy_alpha.webp"] = save(im_rgba, "WEBP", quality=80, method=4)
    f["webp_lossless_alpha.webp"] = save(im_rgba, "WEBP", lossless=True, exact=True)
    flipped = im_rgb.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    f["webp_animated.webp"] = save(im_rgb, "WEBP", save_all=True, lossless=True,
                                   append_images=[flipped], duration=100)

    # GIF
    f["gif_palette.gif"] = save(im_p, "GIF")
    f["gif_transparency.gif"] = save(im_p, "GIF", transparency=5)
    f["gif_animated.gif"] = save(im_p, "GIF", save_all=True, duration=100,
                                 append_images=[im_p.transpose(Image.Transpose.FLIP_TOP_BOTTOM)])
    gpal = rng.integers(0, 256, (64, 3))  # 64 entries: indices >= 64 fall on PIL's grey ramp
    lpal = rng.integers(0, 256, (16, 3))
    sub = (grey[:13, :21] >> 4).astype(np.uint8)  # 21x13 frame of 4-bit indices
    f["gif_offset_interlaced_local.gif"] = gif_bytes(
        W, H, gpal, [gif_frame(sub, 9, 6, lpal, True, transparent=3)])
    # Frame 0 larger than the logical screen (PIL grows the canvas), global palette only, fill 0.
    big = (grey[:20, :30] % 200).astype(np.uint8)
    f["gif_frame_beyond_screen.gif"] = gif_bytes(24, 16, gpal, [gif_frame(big, 5, 4, None, False,
                                                                          transparent=None)])
    # Colour-table choice: no table at all (PIL: mode "L", index = grey level); a global table
    # that is the identity grey ramp (ignored the same way, even for indices past its end); an
    # identity local table over a real global one (PIL then uses the global one).
    wide_idx = ((np.arange(W)[None, :] * 7 + np.arange(H)[:, None] * 29) % 256).astype(np.uint8)
    ramp = np.repeat(np.arange(16)[:, None], 3, axis=1)
    f["gif_no_palette.gif"] = gif_bytes(W, H, None, [gif_frame(wide_idx, 0, 0, None, False, None)])
    f["gif_grey_ramp_palette.gif"] = gif_bytes(
        W, H, ramp, [gif_frame(wide_idx, 0, 0, None, False, None)])
    f["gif_ramp_local_over_global.gif"] = gif_bytes(
        W, H, gpal, [gif_frame(wide_idx, 0, 0, ramp, False, None)])
    # LZW end code after 60% of the pixels: PIL refuses it ("image file is truncated").
    f["gif_early_end.gif"] = gif_bytes(
        W, H, gpal, [gif_frame(sub, 9, 6, None, False, transparent=7, stop_after=160)])

    # An LZW minimum code size of 12 (GIF allows at most 8): refused, and said so.
    frame = bytearray(gif_frame(wide_idx, 0, 0, None, False, None))
    assert frame[10] == 8  # the code size byte, right after the 10-byte image descriptor
    frame[10] = 12
    f["gif_lzw_code_size_12.gif"] = gif_bytes(W, H, gpal, [bytes(frame)])

    # BMP
    f["bmp_24.bmp"] = save(im_rgb, "BMP")
    f["bmp_32.bmp"] = save(im_rgba, "BMP")
    f["bmp_8bit_palette.bmp"] = save(im_p, "BMP")
    f["bmp_1bit.bmp"] = save(im_grey.convert("1"), "BMP")
    # RLE8 and RLE4 (hand-built; Pillow reads but cannot write them): runs, runs longer than the
    # row (clamped), absolute runs with their 16-bit padding, end of line, delta, end of bitmap.
    rle_pal = np.random.default_rng(13).integers(0, 256, (16, 3))
    f["bmp_rle8.bmp"] = bmp_rle_bytes(10, 6, False, bytes([
        4, 1, 0, 3, 2, 3, 4, 0, 0, 0,          # row 0: run, absolute 3 (+pad), end of line
        10, 5, 0, 0,                           # row 1: a whole row, end of line
        0, 2, 3, 0, 7, 6, 0, 0,                # row 2: delta 3 right, run 7
        0, 5, 7, 8, 9, 10, 11, 0, 5, 12, 0, 0,  # row 3: absolute 5 (+pad), run 5
        20, 13, 0, 0,                          # row 4: a run past the row's end
        10, 14, 0, 1]), rle_pal)               # row 5, end of bitmap
    f["bmp_rle4.bmp"] = bmp_rle_bytes(10, 6, True, bytes([
        5, 0x12, 0, 3, 0x34, 0x50, 0, 0,       # row 0: run of 1,2,..., absolute 3, end of line
        10, 0x67, 0, 0,                        # row 1
        0, 2, 4, 0, 6, 0x89, 0, 0,             # row 2: delta 4 right, run 6
        0, 5, 0xAB, 0xCD, 0xE0, 0, 5, 0xFF, 0, 0,  # row 3: absolute 5 (+pad), run 5
        10, 0x1F, 0, 0,                        # row 4
        10, 0x2E, 0, 1]), rle_pal)             # row 5, end of bitmap
    # A palette between the headers and 24-bit pixel data, and a 32-bit file with the 64-byte
    # OS/2 2.x header: stb reads neither, PIL reads both (and so do we, ourselves).
    def with_gap(bmp: bytes, at: int, extra: bytes, header_size: int | None = None) -> bytes:
        out = bytearray(bmp[:at] + extra + bmp[at:])
        struct.pack_into("<I", out, 2, len(out))
        struct.pack_into("<I", out, 10, struct.unpack_from("<I", bmp, 10)[0] + len(extra))
        if header_size is not None:
            struct.pack_into("<I", out, 14, header_size)
        return bytes(out)

    b24 = f["bmp_24.bmp"]
    f["bmp_24_palette_gap.bmp"] = with_gap(b24, 54, bytes(range(64)))
    f["bmp_32_header64.bmp"] = with_gap(f["bmp_32.bmp"], 54, bytes(24), header_size=64)
    # 16-bit: BI_RGB 5-5-5 and BI_BITFIELDS 5-6-5, hand-built (Pillow reads but cannot write them).
    v16 = np.random.default_rng(11).integers(0, 1 << 16, (H, W)).astype("<u2")
    v16[0, :32] = np.arange(32) * 0x0421  # every 5-bit level in each channel
    f["bmp_16bit_555.bmp"] = bmp16_bytes(v16 & 0x7FFF, None)
    f["bmp_16bit_565.bmp"] = bmp16_bytes(v16, (0xF800, 0x07E0, 0x001F))
    # Top-down rows: negative height, rows stored first-to-last.
    b24 = bytearray(f["bmp_24.bmp"])
    off = struct.unpack_from("<I", b24, 10)[0]
    stride = (W * 3 + 3) // 4 * 4
    rows = [b24[off + r * stride : off + (r + 1) * stride] for r in range(H)]
    struct.pack_into("<i", b24, 22, -H)
    b24[off:] = b"".join(reversed(rows))
    f["bmp_24_topdown.bmp"] = bytes(b24)
    return f


# Files the decoder must refuse, and why (the test checks the message mentions the key word).
EXPECT_ERROR = {
    "gif_early_end.gif": "ends early",
    "jpeg_no_eoi.jpg": "truncated",
    "gif_lzw_code_size_12.gif": "code size",
}


def golden(data: bytes) -> dict:
    with Image.open(io.BytesIO(data)) as im, warnings.catch_warnings():
        # "Palette images with Transparency expressed in bytes should be converted to RGBA":
        # transformers calls convert("RGB") regardless, which is what we record.
        warnings.simplefilter("ignore")
        arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
    h, w = arr.shape[:2]
    flat = arr.reshape(-1).astype(np.int64)
    weights = np.arange(flat.size, dtype=np.int64) % 251 + 1
    rng = np.random.default_rng(h * 100003 + w)
    points = [(0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1), (w // 2, h // 2)]
    points += [(int(rng.integers(w)), int(rng.integers(h))) for _ in range(4)]
    return {
        "width": int(w),
        "height": int(h),
        "sum": int(flat.sum()),
        "wsum": int((flat * weights).sum()),
        "samples": [[x, y, *map(int, arr[y, x])] for x, y in points],
        "tolerance": 0,
    }


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    fixtures = make_fixtures()  # before cleaning: it may reuse jpeg_ycck.jpg from disk
    for old in OUT.iterdir():
        if old.name != "expected.json" and old.name not in fixtures:
            old.unlink()
    for name, data in fixtures.items():
        (OUT / name).write_bytes(data)

    doc = {
        "about": "PIL Image.open(f).convert('RGB') per file; written by "
                 "scripts/make_image_fixtures.py. sum = sum of RGB bytes; wsum = sum of "
                 "byte[i] * (i % 251 + 1); samples = [x, y, r, g, b]; tolerance = max abs "
                 "difference per byte allowed (0: bit-exact).",
        "pillow": PIL.__version__,
        "fixtures": {},
        "photos": {},
    }
    for name in sorted(fixtures):
        if name in EXPECT_ERROR:
            doc["fixtures"][name] = {"expect_error": EXPECT_ERROR[name]}
            if not name.endswith(".webp"):  # PIL refuses these too; make sure that stays true
                try:
                    golden(fixtures[name])
                    raise SystemExit(f"{name}: PIL now decodes it; update EXPECT_ERROR")
                except OSError:
                    pass
        else:
            doc["fixtures"][name] = golden(fixtures[name])
    for p in sorted(PHOTO_DIR.iterdir()):
        if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"):
            doc["photos"][p.name] = golden(p.read_bytes())
    (OUT / "expected.json").write_text(json.dumps(doc, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(fixtures)} fixtures + expected.json to {OUT} ({total} bytes); "
          f"{len(doc['photos'])} photos")
    return 0


if __name__ == "__main__":
    sys.exit(main())
