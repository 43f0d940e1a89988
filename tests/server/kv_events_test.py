"""`vlm serve --kv-events`: the prefix cache's KV events, received as a KV-aware router receives
vLLM's (a ZeroMQ SUB socket, msgpack), checked against what the server computed and cached.

A subscriber binds, the server connects to it; a workload of token-id prompts sharing prefixes,
a chat with an image, and enough distinct prompts to evict runs against a small KV cache. Then:
- every message is (topic, consecutive sequence number, msgpack batch) with vLLM's field names;
- a set of hashes driven by the events never stores a hash twice nor removes one it lacks, and
  once the server is idle it holds as many hashes as the server's vlm_prefix_cache_blocks;
- the stored blocks chain: (parent hash, the block's token ids, its extra keys) names one hash and
  one hash only, and every full block of every prompt sent resolves through that chain from the
  first block (the token ids and parents are the prompts' own);
- a block is stored with the image's SHA-256 as its extra key exactly when it holds the image's
  placeholder tokens;
- the replay socket hands back every batch again, byte for byte.
"""

import argparse
import base64
import hashlib
import json
import random
import socket
import tempfile
import threading
import time
import unittest
import urllib.request
from pathlib import Path

import msgpack
import zmq

import serve_util

ARGS = argparse.Namespace(vlm=None, model_dir=None)
BLOCK = 8
IMAGE = serve_util.REPO / "tests/unit/fixtures/images/png_rgb.png"
IMAGE_PAD = 151655  # <|image_pad|>
TOPIC = b"kv@vlm"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(server, path, body):
    req = urllib.request.Request(server.url(path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=serve_util.TIMEOUT) as r:
        return json.loads(r.read())


def wait_idle(server, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s, _ = serve_util.metrics(server)
        if serve_util.value(s, "vlm_num_requests_running") == 0 and \
                serve_util.value(s, "vlm_num_requests_waiting") == 0:
            return s
        time.sleep(0.05)
    raise AssertionError("the server did not go idle")


class KvEventsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = serve_util.make_model_dir(ARGS.model_dir, Path(cls.tmp.name) / "model")
        cls.ctx = zmq.Context()
        cls.sub = cls.ctx.socket(zmq.SUB)
        cls.sub.setsockopt(zmq.SUBSCRIBE, b"")
        port = cls.sub.bind_to_random_port("tcp://127.0.0.1")
        cls.messages = []  # (topic, seq, payload) in arrival order
        cls.last_message = time.monotonic()
        cls.stop_receiving = threading.Event()
        # A router reads its socket all along: a SUB socket only sends its subscription, and so
        # only gets messages, once its owner calls into it.
        cls.receiver = threading.Thread(target=cls.receive, daemon=True)
        cls.receiver.start()
        cls.replay_port = free_port()
        cls.server = serve_util.VlmServer(
            ARGS.vlm, cls.model, cls.tmp.name, "kv_events",
            ["--kv-events", f"tcp://127.0.0.1:{port}",
             "--kv-events-replay", f"tcp://127.0.0.1:{cls.replay_port}",
             "--kv-events-topic", TOPIC.decode(), "--block-size", str(BLOCK), "--num-blocks", "48"])

    @classmethod
    def receive(cls):
        while not cls.stop_receiving.is_set():
            if cls.sub.poll(50):
                cls.messages.append(cls.sub.recv_multipart())
                cls.last_message = time.monotonic()
        cls.sub.close(0)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.stop_receiving.set()
        cls.receiver.join()
        cls.ctx.term()
        cls.tmp.cleanup()

    def drain(self, quiet=0.5):
        """Waits until nothing came for `quiet` seconds."""
        while time.monotonic() - self.last_message < quiet:
            time.sleep(0.05)

    def test_events_mirror_the_prefix_cache(self):
        rng = random.Random(7)
        shared = [rng.randrange(1000, 20000) for _ in range(40)]
        prompts = []
        for i in range(14):
            p = shared[:rng.choice([0, 17, 40])] + [rng.randrange(1000, 20000)
                                                     for _ in range(rng.randrange(9, 60))]
            prompts.append(p)
        prompts += prompts[:4]  # repeats: cache hits
        # The server connects to the subscriber: give the connection time to be made.
        time.sleep(0.5)

        def complete(p):
            post(self.server, "/v1/completions",
                 {"model": serve_util.MODEL, "prompt": p, "max_tokens": 12, "temperature": 0})

        for p in prompts[:6]:
            complete(p)
        threads = [threading.Thread(target=complete, args=(p,)) for p in prompts[6:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        png = IMAGE.read_bytes()
        image_part = {"type": "image_url",
                      "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}
        post(self.server, "/v1/chat/completions",
             {"model": serve_util.MODEL, "max_tokens": 4, "temperature": 0,
              "messages": [{"role": "user", "content": [image_part, {"type": "text",
                                                                    "text": "What is it?"}]}]})
        samples = wait_idle(self.server)
        self.drain()
        self.assertGreater(len(self.messages), 5, self.server.output())

        mirror, ever, chain = set(), set(), {}
        stored = removed = image_blocks = 0
        batches = []
        for i, (topic, seq, payload) in enumerate(self.messages):
            self.assertEqual(topic, TOPIC)
            self.assertEqual(int.from_bytes(seq, "big"), i, "sequence numbers run 0, 1, 2, ...")
            batch = msgpack.unpackb(payload, raw=False)
            batches.append(payload)
            self.assertEqual(list(batch), ["ts", "events", "data_parallel_rank"])
            self.assertIsInstance(batch["ts"], float)
            self.assertLess(abs(batch["ts"] - time.time()), 600)
            self.assertEqual(batch["data_parallel_rank"], 0)
            self.assertTrue(batch["events"])
            for e in batch["events"]:
                kind = e["type"]
                if kind == "BlockStored":
                    self.assertEqual(list(e), ["type", "block_hashes", "parent_block_hash",
                                               "token_ids", "block_size", "lora_id", "medium",
                                               "lora_name", "extra_keys"])
                    self.assertEqual(e["block_size"], BLOCK)
                    self.assertEqual((e["lora_id"], e["lora_name"], e["medium"]), (None, None, "GPU"))
                    hashes, toks = e["block_hashes"], e["token_ids"]
                    self.assertEqual(len(toks), BLOCK * len(hashes))
                    self.assertEqual(len(e["extra_keys"]), len(hashes))
                    parent = e["parent_block_hash"]
                    if parent is not None:
                        self.assertIn(parent, ever, "a parent never stored")
                    for k, h in enumerate(hashes):
                        self.assertIsInstance(h, int)
                        self.assertTrue(0 <= h < 2**64)
                        self.assertNotIn(h, mirror, "stored while already stored")
                        block = tuple(toks[k * BLOCK:(k + 1) * BLOCK])
                        extra = e["extra_keys"][k]
                        if IMAGE_PAD in block:
                            self.assertEqual(extra, [hashlib.sha256(png).hexdigest()])
                            image_blocks += 1
                        else:
                            self.assertIsNone(extra)
                        key = (parent, block, tuple(extra or ()))
                        self.assertEqual(chain.setdefault(key, h), h, "one block, two hashes")
                        mirror.add(h)
                        ever.add(h)
                        stored += 1
                        parent = h
                elif kind == "BlockRemoved":
                    self.assertEqual(list(e), ["type", "block_hashes", "medium"])
                    for h in e["block_hashes"]:
                        self.assertIn(h, mirror, "removed while not stored")
                        mirror.discard(h)
                        removed += 1
                else:
                    self.assertEqual(e, {"type": "AllBlocksCleared"})
                    mirror.clear()
        self.assertEqual(len(set(chain.values())), len(chain), "two blocks, one hash")
        self.assertGreater(removed, 10, "the workload should have evicted blocks")
        self.assertGreater(image_blocks, 0)
        self.assertEqual(len(mirror), serve_util.value(samples, "vlm_prefix_cache_blocks"))
        # Every full block of every prompt sent resolves from its first block.
        for p in prompts:
            parent = None
            for k in range(len(p) // BLOCK):
                key = (parent, tuple(p[k * BLOCK:(k + 1) * BLOCK]), ())
                self.assertIn(key, chain, f"block {k} of a prompt was never stored")
                parent = chain[key]

        # Replay from the start: every batch again, then the end marker.
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = []
        while True:
            self.assertTrue(dealer.poll(10000), "no replay answer")
            empty, seq, payload = dealer.recv_multipart()
            self.assertEqual(empty, b"")
            if seq == (-1).to_bytes(8, "big", signed=True):
                break
            self.assertEqual(int.from_bytes(seq, "big"), len(replayed))
            replayed.append(payload)
        dealer.close(0)
        self.assertEqual(replayed, batches)

    def test_refused_without_prefix_caching_or_with_a_bad_endpoint(self):
        for args, want in (
                (["--kv-events", "tcp://*:5557", "--no-prefix-caching"], "prefix cache, which is off"),
                (["--kv-events", "tcp://*:notaport"], "--kv-events: cannot bind tcp://*:notaport")):
            with self.assertRaises(RuntimeError) as cm:
                serve_util.VlmServer(ARGS.vlm, self.model, self.tmp.name, "refused", args)
            self.assertIn(want, str(cm.exception))


def main():
    serve_util.run_tests(ARGS, __doc__)

if __name__ == "__main__":
    main()
