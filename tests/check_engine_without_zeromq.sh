#!/usr/bin/env bash
# The engine library knows no transport: its archive names no ZeroMQ or msgpack symbol, and a
# program that embeds it (the example) needs no libzmq. The server's archive, which publishes the
# KV events, must name them (else this check could not fail).
# Usage: check_engine_without_zeromq.sh ENGINE_ARCHIVE SERVER_ARCHIVE EXAMPLE_BINARY
set -uo pipefail
engine=$1 server=$2 example=$3
status=0
# ZeroMQ's C API (zmq_*) and msgpack-cxx's mangled names (namespace msgpack: _ZN7msgpack).
pattern=' (zmq_[a-z_]+|_ZN7msgpack[A-Za-z0-9_]*)$'
hits=$(nm -A "$engine" 2>/dev/null | grep -E "$pattern" | head -5)
if [ -n "$hits" ]; then
  echo "the engine library names ZeroMQ or msgpack symbols:"
  echo "$hits"
  status=1
fi
server_syms=$(nm "$server" 2>/dev/null)
if ! grep -qE ' U zmq_send$' <<<"$server_syms"; then
  echo "the server library does not call zmq_send: the KV events' publisher is not where it belongs"
  status=1
fi
needed=$(readelf -d "$example")
if grep -q 'libzmq' <<<"$needed"; then
  echo "$example (the engine alone) needs libzmq"
  status=1
fi
[ $status -eq 0 ] && echo "ok: no ZeroMQ or msgpack in the engine library"
exit $status
