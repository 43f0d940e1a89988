// Video decoding: container bytes -> the sampled frames as 8-bit RGB (vision/image.h).
//
// FFmpeg's libraries (libavformat, libavcodec, libswscale) read MP4 and MOV (H.264, H.265,
// MPEG-4), WebM and MKV (VP8, VP9, AV1 where the build has it), AVI and animated GIF. Animated
// WebP, which FFmpeg 5.1 cannot decode, goes through libwebpdemux (its rate: the frame count over
// the frames' summed durations).
//
// Frame sampling follows transformers 4.57.1 (Qwen3VLVideoProcessor.sample_frames over the
// metadata its PyAV reader gives): the source's frame count is the container's header count
// (the stream's nb_frames) and its rate the stream's average frame rate; n = int(total / fps ×
// target fps), clamped to [min_frames, max_frames] and to total; the indices are
// round(linspace(0, total - 1, n)) (round half to even), counted in the decoder's output order.
// Where a container states no frame count (WebM, MKV), the stream's packets are counted first
// (one per frame, nothing decoded), which transformers does not do (its linspace would be
// empty). Frames are decoded in order up to the last one sampled, and only the sampled ones are
// converted to RGB, as PyAV's to_ndarray(format="rgb24") does. Where the samples lie 16 or more
// frames apart, the packets are read first (not decoded): a frame's index is then its
// timestamp's rank among them, and before each sampled frame the demuxer jumps to the keyframe
// at or before it when that keyframe lies 16 or more frames past what has been decoded, so a
// long video is not decoded whole. Seeking needs one packet per frame, distinct timestamps and a
// first frame that is a keyframe; a decode whose frames do not match the packets' timestamps starts
// again without it. The frames are the same either way.
//
// Only containers that hold their frames in the bytes are read (MP4/MOV family, Matroska/WebM,
// GIF, AVI): playlists and lists (HLS, concat) are refused, and FFmpeg may open nothing but the
// bytes, so a file cannot make it read other files or URLs. A stream that yields fewer frames
// than counted gives the frames it has, as transformers' PyAV reader does.
//
// Every failure (empty, truncated, corrupt, unsupported, over a limit) returns kInvalidArgument
// with one line naming the container and codec where known; nothing aborts, and the limits are
// checked from the header before frames are decoded (frame sizes also by FFmpeg's probe and
// decoder), then on every frame; the wall-time limit also interrupts FFmpeg's reading.
// Thread-safety: reentrant (each call owns its demuxer and decoder).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "vision/image.h"
#include "vlm/status.h"

namespace vlm {

struct VideoLimits {
  int64_t max_bytes = 256 << 20;             // encoded input size
  double max_duration_s = 3 * 3600;          // the container's stated duration
  int64_t max_source_frames = 1'000'000;     // frames stated or decoded
  int64_t max_frame_pixels = 3840 * 2160;    // width × height of one frame
  int64_t max_total_pixels = 1'000'000'000;  // pixels of the sampled frames kept, together
  double max_decode_s = 300;                 // wall time of the whole decode
  // Jump to the keyframe before each sampled frame when the samples lie 16 or more frames apart
  // (see decode_video). false: every frame up to the last sampled one is decoded.
  bool seek = true;
};

// Which frames to take (the video_preprocessor_config.json fields of Qwen3-VL).
struct VideoSampling {
  double fps = 2;  // target frames per second of video
  int64_t min_frames = 4;
  int64_t max_frames = 768;
};

struct VideoFrames {
  std::vector<Image> frames;     // the sampled frames, in order
  std::vector<int64_t> indices;  // their indices among the source's frames
  double source_fps = 0;         // frames per second of the source (timestamps: index / fps)
  int64_t total_frames = 0;      // the source's frame count sampling used
  std::string format;            // "mp4/h264", "webp", ...: for messages and metrics
  int64_t decoded_frames = 0;    // frames the decoder produced (the sampled ones and the rest)
};

// The indices transformers samples from a source of `total` frames at `source_fps` (24 when not
// positive, as there). Empty when total < 1.
std::vector<int64_t> sample_frame_indices(int64_t total, double source_fps, const VideoSampling& s);

// The text Qwen3VLProcessor puts before each temporal group of `merge` frames: "<t.t seconds>",
// t the mean of the group's first and last source timestamps (index / source_fps; the indices
// padded to a multiple of `merge` with the last, as the frames are), printed with one decimal.
// Empty when source_fps is not positive or merge < 1.
std::vector<std::string> video_timestamps(const std::vector<int64_t>& indices, double source_fps,
                                          int64_t merge);

// What becomes of each sampled frame as it is decoded (at the source's size, RGB): the image to
// keep instead, e.g. the frame resized to what preprocessing wants, so that a long video's frames
// are never all held at full size. `sampled`: how many frames the sampling takes. An error stops
// the decode and is returned as is.
using FrameSink = std::function<Result<Image>(Image frame, int64_t sampled)>;

// Decodes the sampled frames of a video held in memory. The format is sniffed from the bytes.
// max_total_pixels counts the frames kept (after `sink`).
Result<VideoFrames> decode_video(const uint8_t* data, size_t size, const VideoSampling& sampling,
                                 const VideoLimits& limits = {}, const FrameSink& sink = {});

}  // namespace vlm
