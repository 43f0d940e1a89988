#include "vision/video_decode.h"

#include <webp/demux.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "vision/preprocess.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/error.h>
#include <libavutil/imgutils.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}

namespace vlm {
namespace {

using Clock = std::chrono::steady_clock;

Status video_error(const std::string& format, const std::string& what) {
  return Status(StatusCode::kInvalidArgument,
                "video" + (format.empty() ? std::string() : " (" + format + ")") + ": " + what);
}

std::string av_message(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(err, buf, sizeof(buf));
  return buf;
}

// The bytes as an AVIOContext: reads and seeks within [data, data + size).
struct MemoryReader {
  const uint8_t* data = nullptr;
  int64_t size = 0, pos = 0;

  static int read(void* opaque, uint8_t* buf, int n) {
    auto* r = static_cast<MemoryReader*>(opaque);
    const int64_t left = r->size - r->pos;
    if (left <= 0) return AVERROR_EOF;
    const int64_t k = std::min<int64_t>(n, left);
    std::memcpy(buf, r->data + r->pos, static_cast<size_t>(k));
    r->pos += k;
    return static_cast<int>(k);
  }
  static int64_t seek(void* opaque, int64_t offset, int whence) {
    auto* r = static_cast<MemoryReader*>(opaque);
    int64_t to = 0;
    switch (whence & ~AVSEEK_FORCE) {
      case AVSEEK_SIZE:
        return r->size;
      case SEEK_SET:
        to = offset;
        break;
      case SEEK_CUR:
        to = r->pos + offset;
        break;
      case SEEK_END:
        to = r->size + offset;
        break;
      default:
        return AVERROR(EINVAL);
    }
    if (to < 0 || to > r->size) return AVERROR(EINVAL);
    r->pos = to;
    return to;
  }
};

struct AvioDeleter {
  void operator()(AVIOContext* io) const {
    if (io == nullptr) return;
    av_freep(&io->buffer);
    avio_context_free(&io);
  }
};
struct FormatDeleter {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};
struct CodecDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsDeleter {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};

// A frame size the limits admit (a header's or a decoded frame's).
Status check_frame_size(int64_t w, int64_t h, const VideoLimits& limits,
                        const std::string& format) {
  if (w <= 0 || h <= 0) return video_error(format, "a frame has no size");
  if (w * h > limits.max_frame_pixels) {
    return video_error(format, "frames of " + std::to_string(w) + "x" + std::to_string(h) +
                                   " exceed the limit of " +
                                   std::to_string(limits.max_frame_pixels) + " pixels");
  }
  return Status();
}

// Keeps a sampled frame: what `sink` makes of it (when set; `sampled` is the count of frames the
// sampling takes), added to the frames kept and to their running pixel total, against the limit.
Status keep_frame(Image img, int64_t sampled, const FrameSink& sink, const VideoLimits& limits,
                  int64_t* total_pixels, const std::string& format, VideoFrames* out) {
  if (sink) {
    Result<Image> kept = sink(std::move(img), sampled);
    if (!kept.ok()) return kept.status();
    img = std::move(kept).value();
  }
  *total_pixels += img.width * img.height;
  if (*total_pixels > limits.max_total_pixels) {
    return video_error(format, "the sampled frames exceed the limit of " +
                                   std::to_string(limits.max_total_pixels) + " pixels together");
  }
  try {
    out->frames.push_back(std::move(img));
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kUnavailable, "video: out of memory");
  }
  return Status();
}

// Animated (or still) WebP through libwebpdemux's animation decoder: frames composited on the
// canvas as browsers show them, alpha dropped. The rate is the frame count over the duration
// (the frames' durations summed from the container, before anything is decoded).
Result<VideoFrames> decode_webp(const uint8_t* data, size_t size, const VideoSampling& sampling,
                                const VideoLimits& limits, const FrameSink& sink,
                                Clock::time_point deadline) {
  const std::string format = "webp";
  WebPData wd{data, size};
  std::unique_ptr<WebPDemuxer, decltype(&WebPDemuxDelete)> demux(WebPDemux(&wd), &WebPDemuxDelete);
  if (!demux) return video_error(format, "not a valid WebP file (corrupt, truncated or too large)");
  const int64_t w = WebPDemuxGetI(demux.get(), WEBP_FF_CANVAS_WIDTH);
  const int64_t h = WebPDemuxGetI(demux.get(), WEBP_FF_CANVAS_HEIGHT);
  VLM_RETURN_IF_ERROR(check_frame_size(w, h, limits, format));  // the canvas
  int64_t count = 0, total_ms = 0;
  WebPIterator it;
  if (WebPDemuxGetFrame(demux.get(), 1, &it)) {
    do {
      ++count;
      total_ms += std::max(0, it.duration);
    } while (count <= limits.max_source_frames && WebPDemuxNextFrame(&it));
    WebPDemuxReleaseIterator(&it);
  }
  demux.reset();
  if (count < 1) return video_error(format, "no frames");
  if (count > limits.max_source_frames) {
    return video_error(format,
                       "more frames than the limit of " + std::to_string(limits.max_source_frames));
  }
  if (static_cast<double>(total_ms) / 1000 > limits.max_duration_s) {
    return video_error(
        format, "a duration of " + std::to_string(total_ms / 1000) + " s exceeds the limit of " +
                    std::to_string(static_cast<int64_t>(limits.max_duration_s)) + " s");
  }
  VideoFrames out;
  out.format = format;
  out.total_frames = count;
  out.source_fps = total_ms > 0 ? static_cast<double>(count) * 1000 / total_ms : 0;
  out.indices = sample_frame_indices(count, out.source_fps, sampling);

  WebPAnimDecoderOptions opt;
  if (!WebPAnimDecoderOptionsInit(&opt)) return video_error(format, "libwebp version mismatch");
  opt.color_mode = MODE_RGBA;
  opt.use_threads = 0;
  std::unique_ptr<WebPAnimDecoder, decltype(&WebPAnimDecoderDelete)> dec(
      WebPAnimDecoderNew(&wd, &opt), &WebPAnimDecoderDelete);
  if (!dec) return video_error(format, "not a valid WebP animation (corrupt or truncated)");
  int64_t total_pixels = 0;
  size_t next = 0;
  for (int64_t i = 0; WebPAnimDecoderHasMoreFrames(dec.get()) && next < out.indices.size(); ++i) {
    uint8_t* buf = nullptr;
    int ts = 0;
    if (!WebPAnimDecoderGetNext(dec.get(), &buf, &ts)) {
      return video_error(format, "frame " + std::to_string(i + 1) + " is corrupt");
    }
    ++out.decoded_frames;
    while (next < out.indices.size() && out.indices[next] == i) {
      Image img;
      img.width = w;
      img.height = h;
      try {
        img.rgb.resize(static_cast<size_t>(w * h * 3));
      } catch (const std::bad_alloc&) {
        return Status(StatusCode::kUnavailable, "video: out of memory");
      }
      for (int64_t p = 0; p < w * h; ++p) std::memcpy(&img.rgb[p * 3], buf + p * 4, 3);
      VLM_RETURN_IF_ERROR(keep_frame(std::move(img), static_cast<int64_t>(out.indices.size()), sink,
                                     limits, &total_pixels, format, &out));
      ++next;
    }
    if (Clock::now() > deadline) {
      return video_error(format, "decoding took longer than the limit");
    }
  }
  if (out.frames.empty()) return video_error(format, "no frames could be decoded");
  out.indices.resize(out.frames.size());
  return out;
}

// A demuxer over the bytes: the reader, its AVIOContext and the opened, probed container.
// The containers a video may be: those that hold their frames in the bytes. Playlist and list
// formats (HLS, concat, ...) would make FFmpeg open other files or URLs named in them, so they
// are not allowed, and nothing may be opened besides the bytes (io_open refuses).
constexpr const char* kContainers = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,gif,avi";

struct Demuxer {
  MemoryReader reader;
  std::unique_ptr<AVIOContext, AvioDeleter> io;
  std::unique_ptr<AVFormatContext, FormatDeleter> fmt;
  std::string format;  // the container's short name
  Clock::time_point deadline;

  // FFmpeg polls it during blocking work (probing, reading): non-zero stops at the deadline.
  static int interrupt(void* opaque) {
    return Clock::now() > static_cast<const Demuxer*>(opaque)->deadline ? 1 : 0;
  }
  static int refuse_open(AVFormatContext*, AVIOContext**, const char*, int, AVDictionary**) {
    return AVERROR(EPERM);
  }

  static Result<std::unique_ptr<Demuxer>> open(const uint8_t* data, size_t size,
                                               const VideoLimits& limits,
                                               Clock::time_point deadline) {
    auto d = std::make_unique<Demuxer>();
    d->reader = MemoryReader{data, static_cast<int64_t>(size), 0};
    d->deadline = deadline;
    constexpr int kIoBuffer = 64 << 10;
    auto* io_buf = static_cast<uint8_t*>(av_malloc(kIoBuffer));
    if (io_buf == nullptr) return Status(StatusCode::kUnavailable, "video: out of memory");
    d->io.reset(avio_alloc_context(io_buf, kIoBuffer, 0, &d->reader, &MemoryReader::read, nullptr,
                                   &MemoryReader::seek));
    if (!d->io) {
      av_free(io_buf);
      return Status(StatusCode::kUnavailable, "video: out of memory");
    }
    AVFormatContext* raw = avformat_alloc_context();
    if (raw == nullptr) return Status(StatusCode::kUnavailable, "video: out of memory");
    raw->pb = d->io.get();
    raw->flags |= AVFMT_FLAG_CUSTOM_IO;
    raw->probesize = 5 << 20;
    raw->interrupt_callback = {&Demuxer::interrupt, d.get()};
    raw->io_open = &Demuxer::refuse_open;
    AVDictionary* open_opts = nullptr;
    av_dict_set(&open_opts, "format_whitelist", kContainers, 0);
    // Frees raw on failure.
    int err = avformat_open_input(&raw, nullptr, nullptr, &open_opts);
    av_dict_free(&open_opts);
    if (err < 0) {
      return video_error(
          "", "not a video format this build reads, or truncated (" + av_message(err) + ")");
    }
    d->fmt.reset(raw);
    d->format = raw->iformat != nullptr ? raw->iformat->name : "";
    if (const size_t comma = d->format.find(','); comma != std::string::npos) {
      d->format.resize(comma);
    }
    // Probing decodes a few frames: bound their size there too (the codecs' own max_pixels
    // check, before any frame buffer is allocated).
    std::vector<AVDictionary*> probe_opts(raw->nb_streams, nullptr);
    const std::string max_pixels = std::to_string(limits.max_frame_pixels);
    for (AVDictionary*& o : probe_opts) av_dict_set(&o, "max_pixels", max_pixels.c_str(), 0);
    err = avformat_find_stream_info(raw, probe_opts.empty() ? nullptr : probe_opts.data());
    for (AVDictionary*& o : probe_opts) av_dict_free(&o);
    if (err < 0) {
      return video_error(d->format, err == AVERROR_EXIT ? "reading took longer than the limit"
                                                        : "unreadable stream information (" +
                                                              av_message(err) + ")");
    }
    return d;
  }
};

bool is_webp(const uint8_t* data, size_t size) {
  return size >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0;
}

// What decode_video checks before it reads anything: the size and the sampling.
Status check_input(const uint8_t* data, size_t size, const VideoSampling& sampling,
                   const VideoLimits& limits) {
  if (data == nullptr || size == 0) return video_error("", "empty input");
  if (static_cast<int64_t>(size) > limits.max_bytes) {
    return video_error("", std::to_string(size) + " bytes exceed the limit of " +
                               std::to_string(limits.max_bytes));
  }
  if (!(sampling.fps > 0) || !std::isfinite(sampling.fps) || sampling.min_frames < 1 ||
      sampling.max_frames < sampling.min_frames) {
    return video_error("", "fps must be positive and 1 <= min_frames <= max_frames");
  }
  return Status();
}

// The video stream of an opened container, with what its header says.
struct VideoStream {
  std::unique_ptr<Demuxer> dm;
  int si = -1;  // the stream's index in the container
  const AVCodec* codec = nullptr;
  std::string format;  // "container/codec"
  double fps = 0;      // the stated average rate (0: none)
  int64_t total = 0;   // the stated frame count (0 or less: none)

  AVFormatContext* fmt() const { return dm->fmt.get(); }
  AVStream* stream() const { return dm->fmt->streams[si]; }
};

// Opens the container and picks its best video stream; refuses frames and durations over the
// limits as the header states them.
Result<VideoStream> open_stream(const uint8_t* data, size_t size, const VideoLimits& limits,
                                Clock::time_point deadline) {
  VideoStream vs;
  auto opened = Demuxer::open(data, size, limits, deadline);
  if (!opened.ok()) return opened.status();
  vs.dm = std::move(opened).value();
  AVFormatContext* fmt = vs.fmt();
  vs.format = vs.dm->format;
  vs.si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &vs.codec, 0);
  if (vs.si < 0 || vs.codec == nullptr) {
    return video_error(vs.format, vs.si == AVERROR_DECODER_NOT_FOUND
                                      ? "no decoder for its video codec"
                                      : "no video stream");
  }
  const AVStream* st = vs.stream();
  vs.format += std::string("/") + vs.codec->name;
  const AVCodecParameters* par = st->codecpar;
  if (par->width <= 0 || par->height <= 0) {  // probing refused the frames, or could not read them
    return video_error(vs.format,
                       "no frame size could be read (corrupt, or frames over the limit of " +
                           std::to_string(limits.max_frame_pixels) + " pixels)");
  }
  VLM_RETURN_IF_ERROR(check_frame_size(par->width, par->height, limits, vs.format));
  double duration = 0;
  if (st->duration > 0 && st->time_base.num > 0) {
    duration = static_cast<double>(st->duration) * av_q2d(st->time_base);
  } else if (fmt->duration > 0) {
    duration = static_cast<double>(fmt->duration) / AV_TIME_BASE;
  }
  if (duration > limits.max_duration_s) {
    return video_error(vs.format,
                       "a duration of " + std::to_string(static_cast<int64_t>(duration)) +
                           " s exceeds the limit of " +
                           std::to_string(static_cast<int64_t>(limits.max_duration_s)) + " s");
  }
  const AVRational rate = st->avg_frame_rate;
  vs.fps = rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0;
  vs.total = st->nb_frames;
  return vs;
}

// NOTE(vlm): 16 frames apart and more: below that the packet pass costs about what seeking saves
// (a 300-frame 720p clip with a keyframe every 60: 11% slower at 32 samples, 9 apart;
// docs/benchmarks.md).
constexpr int64_t kSeekGap = 16;

// Whether `samples` of `total` frames lie far enough apart to seek between.
bool sparse(int64_t total, size_t samples) {
  return total > 0 && total / static_cast<int64_t>(std::max<size_t>(1, samples)) >= kSeekGap;
}

// Where seeking is used: every packet's presentation timestamp, ascending (index i's is
// pts_order[i]), and the indices of the keyframes, ascending. Empty: decode in order.
struct SeekIndex {
  std::vector<int64_t> pts_order;
  std::vector<int64_t> keys;
};

// The seek index of the packets (pts, keyframe) in stream order; empty unless the timestamps are
// distinct and the first frame is a keyframe.
SeekIndex seek_index_of(const std::vector<std::pair<int64_t, bool>>& packets) {
  SeekIndex s;
  for (const auto& pk : packets) s.pts_order.push_back(pk.first);
  std::sort(s.pts_order.begin(), s.pts_order.end());
  const bool distinct =
      std::adjacent_find(s.pts_order.begin(), s.pts_order.end()) == s.pts_order.end();
  for (const auto& pk : packets) {
    if (!pk.second || !distinct) continue;
    s.keys.push_back(std::lower_bound(s.pts_order.begin(), s.pts_order.end(), pk.first) -
                     s.pts_order.begin());
  }
  std::sort(s.keys.begin(), s.keys.end());
  if (!distinct || s.keys.empty() || s.keys[0] != 0) return {};
  return s;
}

// The packet pass, where seeking may pay (samples further apart than a few frames) or where the
// header states no count: reads the stream's packets (nothing decoded) for their count and, to
// seek, each one's timestamp and keyframe flag, from which a decoded frame's index follows. Sets
// the count (and the sampled indices again) where the header had none, then opens the container
// again for the decode.
Status read_packets(const uint8_t* data, size_t size, const VideoSampling& sampling,
                    const VideoLimits& limits, Clock::time_point deadline, VideoStream* vs,
                    std::vector<int64_t>* indices, SeekIndex* seek) {
  std::unique_ptr<AVPacket, PacketDeleter> p(av_packet_alloc());
  if (!p) return Status(StatusCode::kUnavailable, "video: out of memory");
  int64_t count = 0;
  std::vector<std::pair<int64_t, bool>> packets;
  bool timed = true;
  while (av_read_frame(vs->fmt(), p.get()) >= 0) {
    if (p->stream_index == vs->si && p->size > 0) {
      ++count;
      timed = timed && p->pts != AV_NOPTS_VALUE;
      if (timed && limits.seek) packets.emplace_back(p->pts, (p->flags & AV_PKT_FLAG_KEY) != 0);
    }
    av_packet_unref(p.get());
    if (count > limits.max_source_frames) break;
    if (Clock::now() > deadline)
      return video_error(vs->format, "reading took longer than the limit");
  }
  if (vs->total <= 0) {
    vs->total = count;
    *indices = sample_frame_indices(vs->total, vs->fps, sampling);
  }
  // Seeking maps a frame to its index by its timestamp: only where every packet is one frame
  // with a distinct timestamp and the count is the one sampling used.
  if (timed && limits.seek && sparse(vs->total, indices->size()) && count == vs->total &&
      static_cast<int64_t>(packets.size()) == count) {
    *seek = seek_index_of(packets);
  }
  auto again = Demuxer::open(data, size, limits, deadline);
  if (!again.ok()) return again.status();
  vs->dm = std::move(again).value();
  if (vs->si >= static_cast<int>(vs->fmt()->nb_streams)) {
    return video_error(vs->format, "streams changed");
  }
  return Status();
}

// The stream's decoder, single-threaded, refusing frames over the pixel limit.
Result<std::unique_ptr<AVCodecContext, CodecDeleter>> open_decoder(const VideoStream& vs,
                                                                   const VideoLimits& limits) {
  std::unique_ptr<AVCodecContext, CodecDeleter> cc(avcodec_alloc_context3(vs.codec));
  if (!cc) return Status(StatusCode::kUnavailable, "video: out of memory");
  int err = avcodec_parameters_to_context(cc.get(), vs.stream()->codecpar);
  if (err < 0) return video_error(vs.format, "bad codec parameters (" + av_message(err) + ")");
  cc->thread_count = 1;
  cc->max_pixels = limits.max_frame_pixels;
  if ((err = avcodec_open2(cc.get(), vs.codec, nullptr)) < 0) {
    return video_error(vs.format, "cannot open the decoder (" + av_message(err) + ")");
  }
  return cc;
}

// Decodes the stream in order and keeps the sampled frames, as RGB, into `out`.
//
// Seeking (a seek index): each decoded frame's index is its timestamp's rank; before reading on,
// the demuxer jumps to the keyframe at or before the next sampled frame when that keyframe lies
// past what has been decoded. A frame whose timestamp is unknown, or a sampled frame passed over,
// means the timestamps cannot be trusted: run() ends with unseekable() set, and the whole decode
// starts again without seeking.
class FrameDecoder {
 public:
  FrameDecoder(const VideoStream& vs, AVCodecContext* cc, const SeekIndex& seek,
               const VideoLimits& limits, const FrameSink& sink, Clock::time_point deadline,
               VideoFrames* out)
      : vs_(vs),
        cc_(cc),
        seek_(seek),
        seeking_(!seek.pts_order.empty()),
        limits_(limits),
        sink_(sink),
        deadline_(deadline),
        out_(out) {}

  // The error that ended the decode (ok when it ended well or unseekable).
  Status run() {
    pkt_.reset(av_packet_alloc());
    frame_.reset(av_frame_alloc());
    if (!pkt_ || !frame_) return Status(StatusCode::kUnavailable, "video: out of memory");
    bool more = true;
    while (more) {
      if (!seek_ahead()) {
        unseekable_ = true;
        break;
      }
      const int err = av_read_frame(vs_.fmt(), pkt_.get());
      if (err == AVERROR_EOF) break;
      if (err < 0) {
        failed_ =
            video_error(vs_.format, err == AVERROR_EXIT ? "reading took longer than the limit"
                                                        : "unreadable (" + av_message(err) + ")");
        break;
      }
      if (pkt_->stream_index == vs_.si) more = send_packet();
      av_packet_unref(pkt_.get());
    }
    if (failed_.ok() && !unseekable_ && next_ < out_->indices.size()) {  // the delayed frames
      avcodec_send_packet(cc_, nullptr);
      drain();
    }
    return failed_;
  }
  bool unseekable() const { return unseekable_; }

 private:
  // Jumps to the keyframe at or before the next sampled frame where that skips at least kSeekGap
  // frames; false where the jump fails.
  bool seek_ahead() {
    if (!seeking_ || next_ >= out_->indices.size()) return true;
    const int64_t target = out_->indices[next_];
    const int64_t key = *std::prev(std::upper_bound(seek_.keys.begin(), seek_.keys.end(), target));
    if (key <= last_out_ + kSeekGap || key <= sought_) return true;
    avcodec_flush_buffers(cc_);
    if (av_seek_frame(vs_.fmt(), vs_.si, seek_.pts_order[key], AVSEEK_FLAG_BACKWARD) < 0) {
      return false;
    }
    sought_ = key;
    return true;
  }

  // Feeds the packet read to the decoder, taking its frames out; false to stop reading.
  bool send_packet() {
    bool more = true;
    int r = avcodec_send_packet(cc_, pkt_.get());
    while (r == AVERROR(EAGAIN) && (more = drain())) {  // output first, then the packet again
      r = avcodec_send_packet(cc_, pkt_.get());
    }
    if (!more) return false;
    if (r < 0 && seeking_ && sought_ > 0) {
      unseekable_ = true;
      return false;
    }
    if (r < 0) {
      failed_ = video_error(vs_.format, "corrupt data (" + av_message(r) + ")");
      return false;
    }
    return drain();
  }

  // Hands the decoder's frames over; false once every sampled frame is in, or on an error.
  bool drain() {
    for (;;) {
      const int r = avcodec_receive_frame(cc_, frame_.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return true;
      if (r < 0) {
        if (seeking_ && sought_ > 0) {  // perhaps the jump's doing: decode in order instead
          unseekable_ = true;
          return false;
        }
        failed_ = video_error(vs_.format, "frame " + std::to_string(index_ + 1) + " is corrupt (" +
                                              av_message(r) + ")");
        return false;
      }
      if (index_ >= limits_.max_source_frames) {
        failed_ = video_error(vs_.format, "more frames than the limit of " +
                                              std::to_string(limits_.max_source_frames));
        return false;
      }
      ++out_->decoded_frames;
      int64_t at = index_;
      if (seeking_ && !place_frame(&at)) {
        unseekable_ = true;
        return false;
      }
      while (next_ < out_->indices.size() && out_->indices[next_] == at) {
        if (!keep_decoded()) return false;
        ++next_;
      }
      av_frame_unref(frame_.get());
      ++index_;
      if (next_ == out_->indices.size()) return false;
      if (Clock::now() > deadline_) {
        failed_ = video_error(vs_.format, "decoding took longer than the limit");
        return false;
      }
    }
  }

  // Seeking: the decoded frame's index from its timestamp's rank; false where it cannot be
  // trusted.
  bool place_frame(int64_t* at) {
    const int64_t ts = frame_->pts != AV_NOPTS_VALUE ? frame_->pts : frame_->best_effort_timestamp;
    const auto it = std::lower_bound(seek_.pts_order.begin(), seek_.pts_order.end(), ts);
    if (ts == AV_NOPTS_VALUE || it == seek_.pts_order.end() || *it != ts ||
        (next_ < out_->indices.size() && it - seek_.pts_order.begin() > out_->indices[next_])) {
      return false;
    }
    *at = it - seek_.pts_order.begin();
    // Until the first jump the decoder's count is the index too: a mismatch there means a packet
    // that gives no frame (or two), and ranks of timestamps are not indices.
    if (sought_ == 0 && *at != index_) return false;
    last_out_ = std::max(last_out_, *at);
    return true;
  }

  // The decoded frame as RGB, kept (through the sink); false with failed_ set on an error.
  bool keep_decoded() {
    const int w = frame_->width, h = frame_->height;
    failed_ = check_frame_size(w, h, limits_, vs_.format);
    if (!failed_.ok()) return false;
    sws_.reset(sws_getCachedContext(sws_.release(), w, h,
                                    static_cast<AVPixelFormat>(frame_->format), w, h,
                                    AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr, nullptr));
    if (!sws_) {
      failed_ = video_error(vs_.format, "unsupported pixel format");
      return false;
    }
    if (rgb_.w != w || rgb_.h != h) {
      av_freep(&rgb_.data[0]);
      rgb_.w = rgb_.h = 0;
      // 64-byte aligned rows, with room for a 16-pixel overhang on the last.
      if (av_image_alloc(rgb_.data, rgb_.linesize, w + 16, h, AV_PIX_FMT_RGB24, 64) < 0) {
        failed_ = Status(StatusCode::kUnavailable, "video: out of memory");
        return false;
      }
      rgb_.w = w;
      rgb_.h = h;
    }
    sws_scale(sws_.get(), frame_->data, frame_->linesize, 0, h, rgb_.data, rgb_.linesize);
    Image img;
    img.width = w;
    img.height = h;
    try {
      img.rgb.resize(static_cast<size_t>(int64_t{w} * h * 3));
    } catch (const std::bad_alloc&) {
      failed_ = Status(StatusCode::kUnavailable, "video: out of memory");
      return false;
    }
    for (int y = 0; y < h; ++y) {
      std::memcpy(img.rgb.data() + static_cast<size_t>(y) * w * 3,
                  rgb_.data[0] + static_cast<ptrdiff_t>(y) * rgb_.linesize[0],
                  static_cast<size_t>(w) * 3);
    }
    failed_ = keep_frame(std::move(img), static_cast<int64_t>(out_->indices.size()), sink_, limits_,
                         &total_pixels_, vs_.format, out_);
    return failed_.ok();
  }

  const VideoStream& vs_;
  AVCodecContext* cc_;
  const SeekIndex& seek_;
  const bool seeking_;
  const VideoLimits& limits_;
  const FrameSink& sink_;
  const Clock::time_point deadline_;
  VideoFrames* out_;
  std::unique_ptr<AVPacket, PacketDeleter> pkt_;
  std::unique_ptr<AVFrame, FrameDeleter> frame_;
  std::unique_ptr<SwsContext, SwsDeleter> sws_;
  // swscale writes whole vector widths past a row's end on some paths, so it converts into
  // padded, aligned rows (as PyAV's frames are) that are then copied out.
  struct RgbScratch {
    uint8_t* data[4] = {};
    int linesize[4] = {};
    int w = 0, h = 0;
    ~RgbScratch() { av_freep(&data[0]); }
  } rgb_;
  int64_t index_ = 0;  // the decoder's count of frames handed over
  int64_t total_pixels_ = 0;
  size_t next_ = 0;  // the next sampled frame to keep
  Status failed_;
  int64_t last_out_ = -1, sought_ = 0;
  bool unseekable_ = false;
};

}  // namespace

std::vector<int64_t> sample_frame_indices(int64_t total, double source_fps,
                                          const VideoSampling& s) {
  if (total < 1 || !(s.fps > 0) || !std::isfinite(s.fps)) return {};
  const double fps = source_fps > 0 && std::isfinite(source_fps) ? source_fps : 24.0;
  // int() truncates toward zero, as Python's does; clamped as a double before the cast.
  const double want = std::floor(static_cast<double>(total) / fps * s.fps);
  int64_t n = want >= static_cast<double>(total) ? total : static_cast<int64_t>(want);
  n = std::min({std::max(n, s.min_frames), s.max_frames, total});
  if (n < 1) return {};
  // numpy.linspace(0, total - 1, n): i * step, the last exactly total - 1; then .round(), half
  // to even.
  std::vector<int64_t> idx(static_cast<size_t>(n));
  const double stop = static_cast<double>(total - 1);
  const double step = n > 1 ? stop / static_cast<double>(n - 1) : 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = (n > 1 && i == n - 1) ? stop : static_cast<double>(i) * step;
    idx[static_cast<size_t>(i)] = static_cast<int64_t>(round_half_even(v));
  }
  return idx;
}

std::vector<std::string> video_timestamps(const std::vector<int64_t>& indices, double source_fps,
                                          int64_t merge) {
  if (!(source_fps > 0) || merge < 1 || indices.empty()) return {};
  std::vector<int64_t> idx = indices;
  while (static_cast<int64_t>(idx.size()) % merge != 0) idx.push_back(idx.back());
  std::vector<std::string> out;
  for (size_t g = 0; g < idx.size(); g += static_cast<size_t>(merge)) {
    const double first = static_cast<double>(idx[g]) / source_fps;
    const double last = static_cast<double>(idx[g + static_cast<size_t>(merge) - 1]) / source_fps;
    // printf's %.1f rounds the binary value exactly, as Python's format does.
    char buf[64];
    std::snprintf(buf, sizeof(buf), "<%.1f seconds>", (first + last) / 2);
    out.emplace_back(buf);
  }
  return out;
}

Result<VideoFrames> decode_video(const uint8_t* data, size_t size, const VideoSampling& sampling,
                                 const VideoLimits& limits, const FrameSink& sink) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(limits.max_decode_s));
  VLM_RETURN_IF_ERROR(check_input(data, size, sampling, limits));
  if (is_webp(data, size)) return decode_webp(data, size, sampling, limits, sink, deadline);

  av_log_set_level(AV_LOG_QUIET);
  auto opened = open_stream(data, size, limits, deadline);
  if (!opened.ok()) return opened.status();
  VideoStream vs = std::move(opened).value();
  // The sampled indices (again once the packets have been counted, where the header has no
  // count).
  std::vector<int64_t> indices = sample_frame_indices(vs.total, vs.fps, sampling);
  SeekIndex seek;
  if (vs.total <= 0 || (limits.seek && sparse(vs.total, indices.size()))) {
    VLM_RETURN_IF_ERROR(read_packets(data, size, sampling, limits, deadline, &vs, &indices, &seek));
  }
  if (vs.total > limits.max_source_frames) {
    return video_error(vs.format, std::to_string(vs.total) + " frames exceed the limit of " +
                                      std::to_string(limits.max_source_frames));
  }
  if (vs.total < 1) return video_error(vs.format, "no frames");
  auto cc = open_decoder(vs, limits);
  if (!cc.ok()) return cc.status();

  VideoFrames out;
  out.format = vs.format;
  out.source_fps = vs.fps;
  out.total_frames = vs.total;
  out.indices = std::move(indices);
  FrameDecoder decoder(vs, cc.value().get(), seek, limits, sink, deadline, &out);
  const Status failed = decoder.run();
  if (decoder.unseekable()) {  // again in order, within what is left of the time limit
    VideoLimits sequential = limits;
    sequential.seek = false;
    sequential.max_decode_s = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (sequential.max_decode_s <= 0) {
      return video_error(vs.format, "decoding took longer than the limit");
    }
    return decode_video(data, size, sampling, sequential, sink);
  }
  if (!failed.ok()) return failed;
  if (out.frames.empty()) return video_error(vs.format, "no frames could be decoded");
  // Fewer frames than counted (a truncated stream, an edit list): the ones found, as transformers'
  // PyAV reader returns them.
  out.indices.resize(out.frames.size());
  return out;
}

}  // namespace vlm
