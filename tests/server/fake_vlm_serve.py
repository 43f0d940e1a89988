#!/usr/bin/env python3
"""A stand-in for `vlm serve` with a known latency curve, for tune_serve_test.py.

`fake_vlm_serve.py serve -m DIR --port 0 [--max-num-seqs N] [--kv-cache-dtype D]
[--kv-cache-memory BYTES] [other flags, ignored]` prints `serving on http://127.0.0.1:PORT` as
vlm does and answers /health, /v1/models, /metrics and streamed /v1/chat/completions. At most N
requests run at once (the rest wait); each streams `max_tokens` one-token chunks, each after
ITL_BASE_MS + ITL_MS_PER_SEQ[dtype] x (the requests running) milliseconds, the first after
PREFILL_MS. So at N in flight the inter-token latency is known, 400 + 75 N ms (int8: 400 + 45 N),
and the throughput N / (400 + 75 N) grows with N. `--kv-cache-memory` below
MIN_KV_BYTES makes it exit with an error before serving, as a server that cannot fit its cache.
Standard library only.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ITL_BASE_MS = 400.0
ITL_MS_PER_SEQ = {"int8": 45.0}
DEFAULT_ITL_MS_PER_SEQ = 75.0
PREFILL_MS = 20.0
MIN_KV_BYTES = 10_000
DEFAULT_KV_BYTES = 8_000_000


def option(argv, name, default):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


class State:
    def __init__(self, argv):
        self.max_seqs = int(option(argv, "--max-num-seqs", "4"))
        self.per_seq = ITL_MS_PER_SEQ.get(option(argv, "--kv-cache-dtype", "auto"),
                                          DEFAULT_ITL_MS_PER_SEQ)
        self.kv_bytes = int(option(argv, "--kv-cache-memory", str(DEFAULT_KV_BYTES)))
        self.slots = threading.Semaphore(self.max_seqs)
        self.lock = threading.Lock()
        self.running = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, *args):
        pass

    def reply(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        st = self.state
        if self.path == "/health":
            self.reply(200, "{}")
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "fake"}]}))
        elif self.path == "/metrics":
            with st.lock:
                running = st.running
            self.reply(200, "\n".join([
                "# TYPE vlm_num_requests_running gauge",
                f"vlm_num_requests_running {running}",
                "# TYPE vlm_kv_cache_blocks_used gauge",
                f"vlm_kv_cache_blocks_used {running}",
                "# TYPE vlm_kv_cache_blocks_capacity gauge",
                "vlm_kv_cache_blocks_capacity 100",
                "# TYPE vlm_kv_cache_memory_bytes gauge",
                f"vlm_kv_cache_memory_bytes {st.kv_bytes}", ""]), "text/plain")
        else:
            self.reply(404, '{"error": {"message": "no such route"}}')

    def chunk(self, obj):
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        st = self.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions" or not body.get("stream"):
            self.reply(400, '{"error": {"message": "streamed chat completions only"}}')
            return
        tokens = int(body.get("max_tokens", 16))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with st.slots:
            with st.lock:
                st.running += 1
            try:
                time.sleep(PREFILL_MS / 1000)
                for k in range(tokens):
                    if k:
                        with st.lock:
                            running = st.running
                        time.sleep((ITL_BASE_MS + st.per_seq * running) / 1000)
                    self.chunk({"choices": [{"index": 0, "delta": {"content": "x"},
                                             "finish_reason": None}]})
            finally:
                with st.lock:
                    st.running -= 1
        self.chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": tokens}})
        self.chunk(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main(argv):
    if not argv or argv[0] != "serve":
        print("fake_vlm_serve.py: serve ... only", file=sys.stderr)
        return 2
    state = State(argv)
    if state.kv_bytes < MIN_KV_BYTES:
        print(f"vlm: error: --kv-cache-memory {state.kv_bytes} cannot hold one sequence",
              flush=True)
        return 1
    Handler.state = state
    server = ThreadingHTTPServer(("127.0.0.1", int(option(argv, "--port", "0"))), Handler)
    server.daemon_threads = True
    print(f"vlm: serving on http://127.0.0.1:{server.server_address[1]} (fake)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
