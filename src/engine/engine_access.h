// The engine's own sources reach the private parts of the public classes (include/vlm/engine.h)
// through this friend: the loaded model behind an Engine, a request stream's shared state and
// the stream's constructor. Not part of the public API.
#pragma once

#include <memory>

#include "vlm/engine.h"

namespace vlm {

class OutputProcessor;

struct EngineAccess {
  using EngineImpl = Engine::Impl;
  using StreamState = RequestStream::State;
  static EngineImpl& impl(Engine& e) { return *e.impl_; }
  static const EngineImpl& impl(const Engine& e) { return *e.impl_; }
  static std::unique_ptr<RequestStream> make_stream(std::shared_ptr<StreamState> state,
                                                    std::unique_ptr<OutputProcessor> processor);
};

using EngineImpl = EngineAccess::EngineImpl;           // engine_impl.h defines it
using RequestStreamState = EngineAccess::StreamState;  // request_stream.h defines it

}  // namespace vlm
