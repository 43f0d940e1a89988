#!/usr/bin/env bash
# The engine library knows no transport: its archive names no ZeroMQ, msgpack or Boost.Beast/Asio
# symbol, and a program linked against it alone (the example, statically linked to every archive
# the engine pulls in) names none either and needs no libzmq. The server's archive, which publishes the
# KV events, must name them (else this check could not fail).
# Usage: check_engine_without_zeromq.sh ENGINE_ARCHIVE SERVER_ARCHIVE EXAMPLE_BINARY
set -uo pipefail
engine=$1 server=$2 example=$3
status=0
# ZeroMQ's C API (zmq_*) and msgpack-cxx's mangled names (namespace msgpack: _ZN7msgpack).
pattern=' (zmq_[a-z_]+|_ZN[KS]?[0-9]*7msgpack[A-Za-z0-9_]*|_ZN[KS]?5boost(5beast|4asio)[A-Za-z0-9_]*)$'
for f in "$engine" "$example"; do
  if ! syms=$(nm -A "$f" 2>&1); then
    echo "nm $f failed: $syms"
    status=1
    continue
  fi
  hits=$(grep -E "$pattern" <<<"$syms" | head -5)
  if [ -n "$hits" ]; then
    echo "$f names ZeroMQ, msgpack or HTTP symbols:"
    echo "$hits"
    status=1
  fi
done
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
