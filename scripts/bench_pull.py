"""`vlm pull` against huggingface_hub's snapshot_download, side by side, from the same local mock
of the hub (tests/hub/mock_hub.py on loopback): a checkpoint of SHARDS random *.safetensors
files of SHARD_MIB each (plus its small files), each client into a fresh cache, the two
alternating, REPS rounds; the medians and their ratio. Both download several files at once (8
workers); vlm also checks every file's SHA-256 as it arrives. The mock serves from memory in
this process, so on a small machine it shares the CPU with the client: the figures compare the
clients under the same conditions, not a network.

    python scripts/bench_pull.py --vlm build/tools/cli/vlm [--shards 4] [--shard-mib 256] [--reps 3]

Needs huggingface_hub (scripts/requirements-test.txt). Prints a table and one JSON line.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests/hub"))
import mock_hub  # noqa: E402

HF_DOWNLOAD = """
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], cache_dir=sys.argv[2], max_workers=8)
"""


def cpu_model() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def timed(cmd: list, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vlm", required=True)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    files = {f"model-{i + 1:05d}-of-{args.shards:05d}.safetensors": os.urandom(args.shard_mib << 20)
             for i in range(args.shards)}
    files["config.json"] = b'{"model_type": "qwen3_vl"}\n'
    files["tokenizer_config.json"] = b"{}\n"
    repo = mock_hub.Repo("bench/pull")
    repo.commit(files)
    total = sum(len(v) for v in files.values())
    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    times = {"vlm pull": [], "huggingface_hub snapshot_download": []}
    with mock_hub.MockHub([repo]) as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=hub.endpoint, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1",
                   HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1")
        for rep in range(args.reps):
            for name in times:
                cache = work / f"{rep}-{len(times[name])}-{name.split()[0]}"
                e = dict(env, HF_HUB_CACHE=str(cache), HF_HOME=str(work / "home"))
                if name == "vlm pull":
                    cmd = [args.vlm, "pull", "-q", "bench/pull"]
                else:
                    cmd = [sys.executable, "-c", HF_DOWNLOAD, "bench/pull", str(cache)]
                times[name].append(timed(cmd, e))
                shutil.rmtree(cache)
    shutil.rmtree(work)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.shards} x {args.shard_mib} MiB ({total / 2**20:.0f} MiB), {args.reps} rounds, "
          f"CPU: {cpu_model()}")
    print(f"{'client':40} {'median s':>9} {'MiB/s':>8}   runs")
    for k, v in times.items():
        print(f"{k:40} {med[k]:9.2f} {total / 2**20 / med[k]:8.0f}   "
              + " ".join(f"{x:.2f}" for x in v))
    ratio = med["huggingface_hub snapshot_download"] / med["vlm pull"]
    print(f"vlm pull is {ratio:.2f}x as fast as snapshot_download")
    print(json.dumps({"bytes": total, "medians_s": med, "runs_s": times, "ratio": ratio,
                      "cpu": cpu_model()}))


if __name__ == "__main__":
    main()
