// One HTTP request fanned out to several engine requests: a chat's or a completion's choices
// (server/http_server.cc), a pooling request's prompts (server/pooling_route.cc). The base
// submits them on the worker thread that parsed the request and keeps their streams; the
// engine's wake-ups post one drain at a time to the connection's strand, where the subclass
// takes what is ready (drain_streams) and answers; a client that goes away cancels every
// unfinished one. The exchange holds the fan-out until it is answered or closed.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "server/api_response.h"
#include "server/http_transport.h"
#include "server/server_metrics.h"
#include "vlm/status.h"

namespace vlm {

// Stream: movable, default-constructible, `explicit operator bool` (submitted) and cancel()
// (a finished stream ignores it).
template <typename Stream>
class Fanout : public std::enable_shared_from_this<Fanout<Stream>> {
 public:
  virtual ~Fanout() = default;

  // Submits `count` requests, each by `submit(i, notify)` (which makes its request just before,
  // so that only one copy of a request's media is held at a time), then starts the reply; an
  // error cancels the ones already submitted and is the reply.
  using Submit = std::function<Result<Stream>(size_t, std::function<void()>)>;
  void start(size_t count, const Submit& submit) {
    // Sized before on_close can fire: client_gone() walks streams_ from an I/O thread.
    streams_.resize(count);
    sized(count);
    ex_->hold(this->shared_from_this());
    ex_->on_close([w = this->weak_from_this()] {
      if (auto self = w.lock()) self->client_gone();
    });
    if (ex_->closed()) {  // gone while the request was parsed: nothing to run
      m_.requests->inc("cancelled");
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      auto stream = submit(i, [w = this->weak_from_this()] {
        if (auto self = w.lock()) self->wake();
      });
      std::lock_guard<std::mutex> lock(mu_);
      if (!stream.ok()) {
        cancel_locked();
        if (!done_) {
          done_ = true;
          ex_->respond(error_response(api_error_from(stream.status())));
          m_.requests->inc("rejected");
        }
        return;
      }
      streams_[i] = std::move(stream).value();
      if (done_) {  // the client left meanwhile
        cancel_locked();
        return;
      }
    }
    started();
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_ = true;
      scheduled_ = true;
    }
    ex_->post([self = this->shared_from_this()] { self->drain(); });  // what came meanwhile
  }

 protected:
  using Clock = std::chrono::steady_clock;
  // `t0`: when the request came (its latencies count from there).
  Fanout(std::shared_ptr<http::HttpExchange> ex, ServerMetrics& m, Clock::time_point t0)
      : ex_(std::move(ex)), m_(m), t0_(t0) {}

  double seconds_since_start() const {
    return std::chrono::duration<double>(Clock::now() - t0_).count();
  }

  virtual void sized(size_t /*count*/) {}  // before any callback can come
  virtual void started() {}                // every request submitted, before the first drain
  // The connection's strand, the reply not complete: take each stream's ready pieces.
  virtual void drain_streams() = 0;

  // The reply is complete (answered or failed): no more drains; `cancel` cancels every stream.
  void set_done(bool cancel) {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    if (cancel) cancel_locked();
  }

  std::shared_ptr<http::HttpExchange> ex_;
  ServerMetrics& m_;
  const Clock::time_point t0_;
  std::vector<Stream> streams_;  // filled by start(), read by the strand after it

 private:
  // Engine thread: new pieces on some stream.
  void wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (scheduled_ || !started_ || done_) return;
      scheduled_ = true;
    }
    ex_->post([self = this->shared_from_this()] { self->drain(); });
  }

  void drain() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      scheduled_ = false;
      if (done_) return;
    }
    drain_streams();
  }

  // The connection closed before the reply was complete.
  void client_gone() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      done_ = true;
      cancel_locked();
    }
    m_.requests->inc("cancelled");
  }

  void cancel_locked() {
    for (auto& s : streams_) {
      if (s) s.cancel();
    }
  }

  std::mutex mu_;  // started_, scheduled_, done_, and streams_ while start() fills it
  bool started_ = false, scheduled_ = false, done_ = false;
};

}  // namespace vlm
