"""`vlm` and the Hugging Face Hub: models by name (ORG/NAME[@REVISION][:QUANT]) come from the hub's
HTTP API into the cache huggingface_hub keeps, and models that cache holds are used as they are.
The hub is tests/hub/mock_hub.py: a local server that speaks the hub's protocol, with another
(the CDN, another origin) serving the large files it redirects to.

MockIsFaithful needs no vlm: it runs huggingface_hub 2.4 itself against the mock (snapshot_download,
hf_hub_download, list_repo_tree, model_info, scan_cache_dir, with HF_ENDPOINT or endpoint=), and
shows that the client finds there what it expects of the real hub: the redirects to the CDN, the
paged tree listing, the errors it turns into RepositoryNotFoundError, RevisionNotFoundError,
RemoteEntryNotFoundError and GatedRepoError, and that the injected faults (a cut connection, a
flipped byte, a file too big to download, a barrier that measures parallel downloads) do what
they say.

The other classes drive the `vlm` binary (pull, run, serve, ls, rm), each call with a fresh cache
(HF_HUB_CACHE, HF_HOME) unless a test says otherwise, HF_ENDPOINT the mock, and no HF_* variable of
the caller's environment. What vlm downloads is checked against the mock's own hashes and layout
rules (and huggingface_hub's reading of the cache), what it generates against `vlm run` on the
same files from a local folder: no expected output is written down here.

Run with a Python that has scripts/requirements-test.txt (huggingface_hub 2.4 among them), e.g.
the venv scripts/test.sh makes:
    build/pytest-venv/bin/python tests/hub/hub_test.py --vlm build/tools/cli/vlm [unittest args]
    build/pytest-venv/bin/python tests/hub/hub_test.py MockIsFaithful    # the mock alone, no vlm
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pty
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import textwrap
import threading
import time
import unittest
import urllib.error
import urllib.request
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# The caller's Hugging Face settings (a token, a cache, offline mode, another endpoint) must reach
# neither vlm nor the huggingface_hub this process imports: gone before the import reads them.
_SCRUB = ("HF_", "HUGGINGFACE_", "HUGGING_FACE_", "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME")
for _k in [k for k in os.environ if k.startswith(_SCRUB)]:
    del os.environ[_k]
BASE_ENV = dict(os.environ)
_PROCESS_HOME = tempfile.mkdtemp(prefix="hub-test-hf-home-")
os.environ["HF_HOME"] = _PROCESS_HOME  # no token file, no default cache of the user's
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import huggingface_hub as hf  # noqa: E402
from huggingface_hub import errors as hf_errors  # noqa: E402

sys.path.insert(0, str(HERE))
from mock_hub import HugeFile, MockHub, Repo, git_blob_sha1, lfs_pointer, read_folder  # noqa: E402

ARGS = argparse.Namespace(vlm=None)
TIMEOUT = 120
TOKEN = "hf_test_token"  # granted on vlm-test/gated
OTHER_TOKEN = "hf_other_user_token"  # a valid token of a user not granted
TINY = REPO / "models/tiny-qwen35"
TINY_VL = REPO / "models/tiny-qwen3vl"
FULLVOCAB = REPO / "tests/model/fixtures/tiny-fullvocab-bf16"  # --model-dir may name another copy
SCENES = REPO / "tests/model/fixtures/shapes-qa"
PROMPT = "What shape is it?"
RUN_ARGS = ["--greedy", "-n", "8", "-t", "2"]
MIN_PIXELS, MAX_PIXELS = 4096, 25600  # the demo model's image budget (see tests/gguf/demo_gguf_test.py)

HUB: MockHub = None  # started by setUpModule
WORK: Path = None
MAIN = OLD = None  # vlm-test/tiny's commits: main (tiny-qwen35) and an older one (tiny-qwen3vl)


# ---- the repositories ----

OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".ot", ".tflite",
                 ".gguf", ".npz", ".pkl", ".mlmodel", ".nemo")


def vlm_wants(path: str) -> bool:
    """The files of a safetensors repo vlm downloads (the contract): every top-level file but
    weights in other formats (so the snapshot is whole for other tools: README.md and
    .gitattributes come too); nothing in subfolders."""
    return "/" not in path and not path.lower().endswith(OTHER_WEIGHTS)


def split_safetensors(src: Path) -> dict:
    """`src` (a model.safetensors) as transformers shards it: model-0000i-of-00003.safetensors
    (the embedding table alone, then the other tensors in two halves) and
    model.safetensors.index.json; the tensors' bytes unchanged."""
    data = src.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    half = 1 + (len(names) - 1) // 2
    files, weight_map, total = {}, {}, 0
    for i, group in enumerate([names[:1], names[1:half], names[half:]]):
        fname = f"model-{i + 1:05d}-of-00003.safetensors"
        h, chunks, off = {}, [], 0
        for k in group:
            b, e = header[k]["data_offsets"]
            chunks.append(data[8 + n + b:8 + n + e])
            h[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"],
                    "data_offsets": [off, off + e - b]}
            off += e - b
            weight_map[k] = fname
            total += e - b
        if meta is not None:
            h["__metadata__"] = meta
        hj = json.dumps(h, separators=(",", ":")).encode()
        hj += b" " * (-len(hj) % 8)
        files[fname] = struct.pack("<Q", len(hj)) + hj + b"".join(chunks)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    files["model.safetensors.index.json"] = json.dumps(index, indent=2).encode()
    return files


def fullvocab_files() -> dict:
    """The fixture checkpoint with the real Qwen3 tokenizer (as serve_util.make_model_dir)."""
    return {"config.json": (FULLVOCAB / "config.json").read_bytes(),
            "generation_config.json": (FULLVOCAB / "generation_config.json").read_bytes(),
            "model.safetensors": (FULLVOCAB / "model.safetensors").read_bytes(),
            "tokenizer.json": (REPO / "tests/data/tokenizer/tokenizer.json").read_bytes()}


def setUpModule():
    global HUB, WORK, MAIN, OLD
    WORK = Path(os.path.realpath(tempfile.mkdtemp(prefix="hub-test-")))
    tiny = Repo("vlm-test/tiny")
    OLD = tiny.commit({**read_folder(TINY_VL), "README.md": b"# tiny (Qwen3-VL)\n"}, message="Qwen3-VL")
    template = json.loads((TINY / "tokenizer_config.json").read_text())["chat_template"]
    MAIN = tiny.commit({
        **read_folder(TINY),
        # What vlm fetches beside the weights: the template (the same as tokenizer_config.json's,
        # so the output does not change), the licence, the card ...
        "chat_template.jinja": template.encode(), "LICENSE.txt": b"Apache-2.0\n",
        "README.md": b"# tiny\n\nA test model.\n",
        # ... and what it does not: other weight formats, anything in a subfolder.
        "original/params.json": b'{"dim": 64, "n_layers": 2}\n', "model.bin": os.urandom(65536),
        "original/consolidated.00.pth": os.urandom(32768)}, message="Qwen3.5")
    tiny.tag("v1.0", OLD)
    local_fullvocab = WORK / "fullvocab"  # the unsharded checkpoint, as a local folder
    local_fullvocab.mkdir()
    for name, data in fullvocab_files().items():
        (local_fullvocab / name).write_bytes(data)
    sharded = fullvocab_files()
    del sharded["model.safetensors"]
    sharded.update(split_safetensors(FULLVOCAB / "model.safetensors"))
    huge = {k: v for k, v in read_folder(TINY).items() if k != "model.safetensors"}
    huge["model.safetensors"] = HugeFile(2 ** 60)
    HUB = MockHub([tiny,
                   Repo.from_folder("vlm-test/gated", TINY, gated="manual", granted={TOKEN}),
                   Repo("vlm-test/sharded"), Repo("vlm-test/huge")],
                  valid_tokens={TOKEN, OTHER_TOKEN}).start()
    HUB.repos["vlm-test/sharded"].commit(sharded)
    HUB.repos["vlm-test/huge"].commit(huge)
    # Two files with the same bytes: one blob.
    cfg = (TINY / "config.json").read_bytes()
    HUB.add_repo(Repo("vlm-test/dup")).commit({**read_folder(TINY), "config.copy.json": cfg})
    # A hostile listing: a GGUF path that climbs out of the snapshot folder.
    HUB.add_repo(Repo("vlm-test/hostile")).commit({"../../../escaped-Q8_0.gguf": b"GGUF....",
                                                    "README.md": b"# hostile\n"})
    # Files over huggingface_hub's 10 MiB read chunk, so that it resumes a cut download mid-file.
    HUB.add_repo(Repo("vlm-test/big")).commit({"big.bin": os.urandom(11 << 20),
                                                "big.txt": os.urandom(11 << 20)})


def tearDownModule():
    if HUB is not None:
        HUB.stop()
    if WORK is not None:
        shutil.rmtree(WORK, ignore_errors=True)
    shutil.rmtree(_PROCESS_HOME, ignore_errors=True)


def commit_of(repo_id: str, revision: str = "main"):
    return HUB.repos[repo_id].resolve(revision)


def tree_cache_json(commit) -> dict:
    """trees/<commit>.json as huggingface_hub 2.4 writes it (_tree_cache.py): every file of the
    commit, its size and git oid, and for an LFS file its sha256 and size."""
    files = {}
    for p, e in sorted(commit.files.items()):
        files[p] = {"size": e.size, "blob_id": e.blob_id}
        if e.lfs:
            files[p].update(lfs_sha256=e.sha256, lfs_size=e.size)
    return {"format_version": 1, "files": files}


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def blob_requests(server: str, etag: str, method: str = "GET") -> list:
    return [e for e in HUB.requests(server=server, method=method) if e["path"].endswith("/" + etag)]


def resolve_requests(repo_id: str, method: str | None = None) -> list:
    return HUB.requests(server="hub", method=method, contains=f"/{repo_id}/resolve/")


def resolved_path(entry: dict) -> str:
    """The file path of a /ORG/NAME/resolve/REV/PATH request."""
    return entry["path"].split("/", 5)[5]


def cdn_gets() -> list:
    """The blobs (sha256) the CDN was asked for, in order."""
    return [e["path"].rsplit("/", 1)[1] for e in HUB.requests(server="cdn", method="GET")]


def wanted(commit) -> list:
    """The commit's files vlm is to download from a safetensors repo."""
    return [p for p in commit.files if vlm_wants(p)]


def hf_kw(cache: Path) -> dict:
    """huggingface_hub's arguments for the mock, no token, cache `cache`."""
    return dict(cache_dir=cache, endpoint=HUB.endpoint, token=False)


@contextlib.contextmanager
def hf_quiet(test: unittest.TestCase):
    """Asserts that huggingface_hub warns of nothing (its logger, Python warnings) in the block."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("huggingface_hub")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in records] + [f"{w.category.__name__}: {w.message}" for w in caught]
    test.assertEqual(said, [])


class Sandbox:
    """A fresh HF_HOME (home/) and cache (home/hub) for vlm, or huggingface_hub, to work in."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(dir=WORK))
        self.home = self.root / "home"
        self.cache = self.home / "hub"
        self.home.mkdir()

    def env(self, **extra) -> dict:
        env = dict(BASE_ENV, HF_ENDPOINT=HUB.endpoint, HF_HOME=str(self.home),
                   HF_HUB_CACHE=str(self.cache))
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def repo(self, repo_id: str) -> Path:
        return repo_folder(self.cache, repo_id)

    def snapshot(self, repo_id: str, revision: str = "main") -> Path:
        return self.repo(repo_id) / "snapshots" / commit_of(repo_id, revision).sha

    def vlm(self, *args, rc: int = 0, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
        """Runs vlm; fails the test unless it exits with `rc` (1: an error, whose message must
        start "vlm: " on stderr)."""
        r = subprocess.run([ARGS.vlm, *map(str, args)], env=self.env(**(env or {})), cwd=cwd,
                           capture_output=True, text=True, timeout=TIMEOUT)
        cmd = "vlm " + " ".join(map(str, args))
        if r.returncode != rc:
            raise AssertionError(f"{cmd}: exit {r.returncode}, expected {rc}\n"
                                 f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-4000:]}")
        if rc == 1 and not re.search(r"^vlm: ", r.stderr, re.M):
            raise AssertionError(f"{cmd}: no 'vlm: ' message on stderr: {r.stderr!r}")
        return r

    def pull(self, name: str, *args, env: dict | None = None) -> Path:
        """`vlm pull NAME`: the path it prints last."""
        out = self.vlm("pull", name, *args, env=env).stdout.strip().splitlines()
        return Path(out[-1])


_LOCAL_RUNS: dict = {}


def local_run(*args) -> str:
    """stdout of `vlm run ARGS` on local files (run once per arguments)."""
    if args not in _LOCAL_RUNS:
        _LOCAL_RUNS[args] = Sandbox().vlm("run", *args).stdout
    return _LOCAL_RUNS[args]


def local_run_cmd(*args) -> str:
    """stdout of `vlm ARGS` on local files."""
    return Sandbox().vlm(*args).stdout


def need_vlm():
    if not ARGS.vlm:
        raise RuntimeError("these tests run the vlm binary: pass --vlm PATH "
                           "(MockIsFaithful runs without it)")


class CacheChecks:
    """Assertions on the cache layout vlm is to write (huggingface_hub's)."""

    def assert_snapshot(self, sb: Sandbox, repo_id: str, commit, paths, fresh: bool = True):
        """snapshots/<commit> holds exactly `paths`, each a relative symlink to ../(..)/blobs/<etag>
        whose bytes hash to that etag and are the mock's; no .incomplete is left; in a fresh cache
        blobs/ holds those blobs alone, each with its lock file."""
        repo = sb.repo(repo_id)
        snap = repo / "snapshots" / commit.sha
        found = {p.relative_to(snap).as_posix() for p in snap.rglob("*") if not p.is_dir()}
        self.assertEqual(found, set(paths), f"{snap}'s files")
        for p in paths:
            e = commit.files[p]
            link = snap / p
            blob = repo / "blobs" / e.etag
            self.assertTrue(link.is_symlink(), f"{link} is not a symlink")
            self.assertEqual(os.readlink(link), os.path.relpath(blob, link.parent), f"{link}'s target")
            data = blob.read_bytes()
            self.assertEqual(hashlib.sha256(data).hexdigest() if e.lfs else git_blob_sha1(data), e.etag, p)
            self.assertEqual(data, e.data, p)
        self.assertEqual([b.name for b in (repo / "blobs").iterdir() if b.name.endswith(".incomplete")], [])
        if fresh:
            etags = {commit.files[p].etag for p in paths}
            self.assertEqual({b.name for b in (repo / "blobs").iterdir()}, etags)
            locks = sb.cache / ".locks" / repo.name
            for etag in etags:
                self.assertTrue((locks / f"{etag}.lock").exists(), f"no lock file {locks}/{etag}.lock")

    def assert_no_cdn_auth(self):
        """The token went to the hub only: the CDN (another origin) never saw an Authorization."""
        self.assertEqual([e["path"] for e in HUB.requests(server="cdn") if e["auth"]], [])


# =====================================================================================
# The mock against huggingface_hub itself.
# =====================================================================================

class MockIsFaithful(unittest.TestCase, CacheChecks):
    """huggingface_hub 2.4, the reference client, works against the mock as against the hub."""

    def setUp(self):
        HUB.reset()
        self.sb = Sandbox()

    def test_snapshot_download_through_the_cdn(self):
        """snapshot_download fetches every file with no warning: the tree in pages (Link rel=next),
        the regular files from the hub, the LFS ones from the CDN after a 302 (without the
        Authorization header); the cache it writes is the layout this file checks vlm's against
        (blob names, relative links, trees/<commit>.json), and scan_cache_dir reads it cleanly."""
        c = commit_of("vlm-test/tiny")
        with hf_quiet(self):
            path = hf.snapshot_download("vlm-test/tiny", **{**hf_kw(self.sb.cache), "token": TOKEN})
        self.assertEqual(Path(path), self.sb.snapshot("vlm-test/tiny"))
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, list(c.files))
        self.assertEqual((self.sb.repo("vlm-test/tiny") / "refs/main").read_text(), MAIN)
        tree = json.loads((self.sb.repo("vlm-test/tiny") / "trees" / f"{MAIN}.json").read_text())
        self.assertEqual(tree, tree_cache_json(c))
        n_entries = len(c.files) + len(c.directories())
        pages = len(HUB.requests(server="hub", contains="/tree/"))
        self.assertEqual(pages, -(-n_entries // HUB.page_size))
        self.assertEqual(set(cdn_gets()), {e.sha256 for e in c.files.values() if e.lfs})
        for e in resolve_requests("vlm-test/tiny"):
            self.assertEqual(e["status"], 302 if c.files[resolved_path(e)].lfs else 200, e["path"])
            self.assertEqual(e["authorization"], f"Bearer {TOKEN}")
        self.assert_no_cdn_auth()
        with hf_quiet(self):
            scan = hf.scan_cache_dir(self.sb.cache)
        self.assertEqual(scan.warnings, [])
        (repo,) = scan.repos
        (rev,) = repo.revisions
        self.assertEqual((repo.repo_id, rev.commit_hash, set(rev.refs), rev.nb_files),
                         ("vlm-test/tiny", MAIN, {"main"}, len(c.files)))
        blobs = {e.etag: e.size for e in c.files.values()}
        self.assertEqual(repo.size_on_disk, sum(blobs.values()))

    def test_hf_endpoint_variable(self):
        """With HF_ENDPOINT (read when huggingface_hub is imported) instead of endpoint=, a fresh
        Python downloads a file, a revision pinned by commit, and a gated file with its token,
        printing nothing on stderr; the token does not follow the redirect to the CDN."""
        code = textwrap.dedent("""
            import sys, huggingface_hub as h
            print(h.hf_hub_download("vlm-test/tiny", "model.safetensors"))
            print(h.snapshot_download("vlm-test/tiny", revision=sys.argv[1], allow_patterns=["*.json"]))
            print(h.hf_hub_download("vlm-test/gated", "model.safetensors", token=sys.argv[2]))
        """)
        env = self.sb.env(HF_HUB_DISABLE_PROGRESS_BARS="1")
        r = subprocess.run([sys.executable, "-c", code, OLD, TOKEN], env=env, capture_output=True,
                           text=True, timeout=TIMEOUT)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        paths = r.stdout.split()
        self.assertEqual(Path(paths[0]), self.sb.snapshot("vlm-test/tiny") / "model.safetensors")
        self.assertEqual(Path(paths[1]), self.sb.snapshot("vlm-test/tiny", OLD))
        self.assertEqual(Path(paths[2]).read_bytes(), (TINY / "model.safetensors").read_bytes())
        self.assertFalse((self.sb.repo("vlm-test/tiny") / "refs" / OLD).exists())
        self.assertEqual(len(HUB.requests(server="cdn", method="GET")), 2)
        self.assert_no_cdn_auth()

    def test_tree_and_info(self):
        """list_repo_tree (recursive, one folder, the root) and model_info (by branch, tag and
        commit; files_metadata) read the mock's answers into the entries the hub's would give:
        git oids, LFS sha256 and pointer sizes; a gated repo's info and tree need no token."""
        api = hf.HfApi(endpoint=HUB.endpoint, token=False)
        c = commit_of("vlm-test/tiny")
        with hf_quiet(self):
            entries = list(api.list_repo_tree("vlm-test/tiny", recursive=True))
            root = list(api.list_repo_tree("vlm-test/tiny"))
            sub = list(api.list_repo_tree("vlm-test/tiny", "original", revision=MAIN))
            infos = [api.model_info("vlm-test/tiny", revision=r) for r in (None, "main", "v1.0", OLD)]
            meta = api.model_info("vlm-test/tiny", files_metadata=True)
            gated = api.model_info("vlm-test/gated")
            gated_tree = list(api.list_repo_tree("vlm-test/gated", recursive=True))
        files = {f.path: f for f in entries if isinstance(f, hf.hf_api.RepoFile)}
        self.assertEqual(set(files), set(c.files))
        self.assertEqual({f.path for f in entries if isinstance(f, hf.hf_api.RepoFolder)}, {"original"})
        for p, f in files.items():
            data = c.files[p].data
            self.assertEqual(f.size, len(data), p)
            if c.files[p].lfs:
                sha = hashlib.sha256(data).hexdigest()
                self.assertEqual((f.lfs.sha256, f.lfs.size, f.lfs.pointer_size),
                                 (sha, len(data), len(lfs_pointer(sha, len(data)))), p)
                self.assertEqual(f.blob_id, git_blob_sha1(lfs_pointer(sha, len(data))), p)
            else:
                self.assertIsNone(f.lfs, p)
                self.assertEqual(f.blob_id, git_blob_sha1(data), p)
        self.assertIn("original", {f.path for f in root})
        self.assertNotIn("original/params.json", {f.path for f in root})
        self.assertEqual({f.path for f in sub}, {"original/params.json", "original/consolidated.00.pth"})
        self.assertEqual([i.sha for i in infos], [MAIN, MAIN, OLD, OLD])
        self.assertEqual({s.rfilename for s in infos[3].siblings}, set(commit_of("vlm-test/tiny", OLD).files))
        self.assertEqual({s.rfilename: s.blob_id for s in meta.siblings},
                         {p: e.blob_id for p, e in c.files.items()})
        self.assertEqual((gated.gated, len([f for f in gated_tree if isinstance(f, hf.hf_api.RepoFile)])),
                         ("manual", len(commit_of("vlm-test/gated").files)))
        self.assertGreater(len(HUB.requests(contains="/tree/")), 4)  # paged

    def test_errors(self):
        """Unknown repo (401 without a token, 404 with one), unknown revision, unknown file, a
        gated repo without a token (401) and with a token not granted (403), a token the hub does
        not know: each raises the error huggingface_hub raises for the real hub's answer."""
        kw = dict(cache_dir=self.sb.cache, endpoint=HUB.endpoint)
        gate_401 = ("Access to model vlm-test/gated is restricted. You must have access to it and "
                    "be authenticated")
        gate_403 = "Access to model vlm-test/gated is restricted and you are not in the authorized list"
        cases = [
            (hf_errors.RepositoryNotFoundError, 401, "Invalid username or password",
             lambda: hf.hf_hub_download("vlm-test/nope", "config.json", token=False, **kw)),
            (hf_errors.RepositoryNotFoundError, 404, "Repository not found",
             lambda: hf.hf_hub_download("vlm-test/nope", "config.json", token=OTHER_TOKEN, **kw)),
            (hf_errors.RepositoryNotFoundError, 401, "Repository Not Found",
             lambda: hf.snapshot_download("vlm-test/nope", token=False, **kw)),
            (hf_errors.RevisionNotFoundError, 404, "Invalid rev id: nope",
             lambda: hf.hf_hub_download("vlm-test/tiny", "config.json", revision="nope", token=False, **kw)),
            (hf_errors.RevisionNotFoundError, 404, "Revision Not Found",
             lambda: hf.snapshot_download("vlm-test/tiny", revision="f" * 40, token=False, **kw)),
            (hf_errors.RemoteEntryNotFoundError, 404, "Entry not found",
             lambda: hf.hf_hub_download("vlm-test/tiny", "nope.json", token=False, **kw)),
            (hf_errors.GatedRepoError, 401, gate_401,
             lambda: hf.hf_hub_download("vlm-test/gated", "config.json", token=False, **kw)),
            (hf_errors.GatedRepoError, 403, gate_403,
             lambda: hf.hf_hub_download("vlm-test/gated", "config.json", token=OTHER_TOKEN, **kw)),
            (hf_errors.GatedRepoError, 401, gate_401,
             lambda: hf.snapshot_download("vlm-test/gated", token=False, **kw)),
            (hf_errors.HfHubHTTPError, 401, "Invalid credentials in Authorization header",
             lambda: hf.hf_hub_download("vlm-test/tiny", "config.json", token="hf_bogus", **kw)),
        ]
        for i, (error, status, message, call) in enumerate(cases):
            with self.subTest(i=i, error=error.__name__):
                with self.assertRaises(error) as cm:
                    call()
                self.assertEqual(cm.exception.response.status_code, status)
                self.assertIn(message.lower(), str(cm.exception).lower())
        # The gated snapshot failed at the files, after the tree listed fine without a token.
        self.assertTrue(all(e["status"] == 200 for e in HUB.requests(contains="vlm-test/gated/tree/")))
        with hf_quiet(self):
            p = hf.snapshot_download("vlm-test/gated", token=TOKEN, **kw)
        self.assertEqual(Path(p, "model.safetensors").read_bytes(), (TINY / "model.safetensors").read_bytes())
        self.assert_no_cdn_auth()

    def test_faults(self):
        """A connection cut after K bytes (headers promising the whole file) is resumed by
        huggingface_hub with Range: bytes=N- (N what it had written: a multiple of its 10 MiB
        chunks) on the CDN and, for a regular file, on the hub; a corrupted body is the file with
        one byte flipped (huggingface_hub does not check)."""
        c = commit_of("vlm-test/big")
        kw = hf_kw(self.sb.cache)
        chunk = hf.constants.DOWNLOAD_CHUNK_SIZE
        for path in ("big.bin", "big.txt"):
            HUB.add_fault("cut", repo="vlm-test/big", path=path, at=chunk + 12345)
        quiet = logging.getLogger("huggingface_hub")
        level, quiet.level = quiet.level, logging.ERROR  # its "Trying to resume download..." warnings
        try:
            for path in ("big.bin", "big.txt"):
                got = Path(hf.hf_hub_download("vlm-test/big", path, **kw)).read_bytes()
                self.assertEqual(got, c.files[path].data)
        finally:
            quiet.level = level
        for path, server in (("big.bin", "cdn"), ("big.txt", "hub")):
            e = c.files[path]
            gets = (blob_requests("cdn", e.sha256) if e.lfs else
                    [g for g in resolve_requests("vlm-test/big", "GET") if g["path"].endswith(path)])
            self.assertEqual([(g["server"], g["range"], g["sent"], g["status"]) for g in gets],
                             [(server, None, chunk + 12345, 200),
                              (server, f"bytes={chunk}-", e.size - chunk, 206)])
        self.assertEqual([f.fired for f in HUB.faults], [1, 1])
        c = commit_of("vlm-test/tiny")
        HUB.add_fault("corrupt", repo="vlm-test/tiny", path="tokenizer.json", at=1234)
        got = Path(hf.hf_hub_download("vlm-test/tiny", "tokenizer.json", **kw)).read_bytes()
        want = c.files["tokenizer.json"].data
        self.assertEqual(len(got), len(want))
        self.assertEqual([i for i in range(len(want)) if got[i] != want[i]], [1234])

    def test_huge_file_is_never_served(self):
        """The huge repo's model claims 2**60 bytes in its tree and X-Linked-Size: huggingface_hub
        warns there is not enough disk space and refuses it (over its 50 GB plain-HTTP limit)
        without a request to the CDN."""
        api = hf.HfApi(endpoint=HUB.endpoint, token=False)
        sizes = {f.path: f.size for f in api.list_repo_tree("vlm-test/huge")}
        self.assertEqual(sizes["model.safetensors"], 2 ** 60)
        url = hf.hf_hub_url("vlm-test/huge", "model.safetensors", endpoint=HUB.endpoint)
        meta = hf.get_hf_file_metadata(url, token=False)
        self.assertEqual(meta.size, 2 ** 60)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with self.assertRaises(ValueError):
                hf.hf_hub_download("vlm-test/huge", "model.safetensors", **hf_kw(self.sb.cache))
        self.assertTrue(any("Not enough free disk space" in str(w.message) for w in caught))
        self.assertEqual(HUB.requests(server="cdn"), [])

    def test_cdn_barrier_measures_parallel_downloads(self):
        """With the barrier on, snapshot_download's 8 workers have the three shards in flight
        together (the record says 2 or more); one worker never has two (the record says 1)."""
        HUB.cdn_barrier = 2
        with hf_quiet(self):
            hf.snapshot_download("vlm-test/sharded", **hf_kw(self.sb.cache))
        self.assertGreaterEqual(HUB.cdn_max_concurrent, 2)
        self.assertEqual(len(HUB.requests(server="cdn", method="GET")), 3)
        HUB.reset()
        HUB.cdn_barrier, HUB.barrier_timeout = 2, 0.2
        hf.snapshot_download("vlm-test/sharded", **hf_kw(Sandbox().cache), max_workers=1)
        self.assertEqual(HUB.cdn_max_concurrent, 1)

    def test_http_details(self):
        """What huggingface_hub does not look at but an HTTP client may: the hub's 200 with a
        quoted git-sha1 ETag, its Range answers (206 with Content-Range, 416 past the end), the
        302's absolute Location on another origin, the CDN's Range, its refusal of a request
        that carries credentials or a wrong signature, and no compression even when asked."""
        c = commit_of("vlm-test/tiny")
        url = f"{HUB.endpoint}/vlm-test/tiny/resolve/main/"

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k):
                return None
        opener = urllib.request.build_opener(NoRedirect)

        def fetch(u, method="GET", **headers):
            req = urllib.request.Request(u, method=method, headers={"Accept-Encoding": "gzip", **headers})
            try:
                with opener.open(req, timeout=30) as r:
                    return r.status, r.headers, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.headers, e.read()

        config, model = c.files["config.json"], c.files["model.safetensors"]
        st, h, body = fetch(url + "config.json")
        self.assertEqual((st, h["ETag"], int(h["Content-Length"]), body, h["X-Repo-Commit"]),
                         (200, f'"{config.blob_id}"', config.size, config.data, MAIN))
        self.assertIsNone(h["Content-Encoding"])
        st, h, body = fetch(url + "config.json", Range="bytes=10-")
        self.assertEqual((st, h["Content-Range"], body),
                         (206, f"bytes 10-{config.size - 1}/{config.size}", config.data[10:]))
        self.assertEqual(fetch(url + "config.json", Range=f"bytes={10 ** 6}-")[0], 416)
        st, h, _ = fetch(url + "model.safetensors", "HEAD")
        self.assertEqual((st, h["X-Linked-Etag"], int(h["X-Linked-Size"]), h["X-Repo-Commit"]),
                         (302, f'"{model.sha256}"', model.size, MAIN))
        loc = h["Location"]
        self.assertTrue(loc.startswith(HUB.cdn_endpoint + "/") and HUB.cdn_endpoint != HUB.endpoint, loc)
        st, h, body = fetch(loc, Range="bytes=8-")
        self.assertEqual((st, h["Content-Range"], body, h["Content-Encoding"]),
                         (206, f"bytes 8-{model.size - 1}/{model.size}", model.data[8:], None))
        self.assertEqual(fetch(loc, Authorization=f"Bearer {TOKEN}")[0], 400)
        self.assertEqual(fetch(loc.replace("sig=", "sig=0"))[0], 403)


# =====================================================================================
# vlm against the mock.
# =====================================================================================

class VlmTestCase(unittest.TestCase, CacheChecks):

    @classmethod
    def setUpClass(cls):
        need_vlm()

    def setUp(self):
        HUB.reset()
        self.sb = Sandbox()

    def assert_fails(self, r: subprocess.CompletedProcess, *needles: str):
        """r's stderr holds each needle (case-insensitive)."""
        for n in needles:
            self.assertIn(n.lower(), r.stderr.lower(), f"{n!r} not in vlm's stderr: {r.stderr}")


class VlmDownloads(VlmTestCase):

    def test_pull_then_run_as_from_the_local_folder(self):
        """`vlm pull` downloads the top-level files but other weights (the card and
        .gitattributes too; not the .bin, nor the subfolder's .pth and .json), in
        huggingface_hub's layout: blobs named by sha256 / git sha1 and
        checked, relative links (one folder down too), refs/main, trees/<commit>.json the
        whole listing as huggingface_hub writes it, a lock per blob; it prints the snapshot.
        `vlm run -m vlm-test/tiny` then prints what `vlm run -m models/tiny-qwen35` prints, from
        the cache: no file is fetched again."""
        c = commit_of("vlm-test/tiny")
        path = self.sb.pull("vlm-test/tiny")
        repo = self.sb.repo("vlm-test/tiny")
        self.assertEqual(path, repo / "snapshots" / MAIN)
        self.assertEqual(sorted(p for p in c.files if p not in wanted(c)),
                         ["model.bin", "original/consolidated.00.pth", "original/params.json"])
        self.assertIn("README.md", wanted(c))
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, wanted(c))
        self.assertEqual((repo / "refs/main").read_text(), MAIN)
        self.assertEqual(json.loads((repo / "trees" / f"{MAIN}.json").read_text()), tree_cache_json(c))
        asked = {resolved_path(e) for e in resolve_requests("vlm-test/tiny")}
        self.assertEqual(asked - set(wanted(c)), set())
        unwanted = {c.files[p].etag for p in c.files if not vlm_wants(p)}
        self.assertEqual([b for b in cdn_gets() if b in unwanted], [])
        self.assertEqual([e for e in HUB.log if e["auth"]], [])
        HUB.reset()
        got = self.sb.vlm("run", "-m", "vlm-test/tiny", *RUN_ARGS, "-p", PROMPT).stdout
        self.assertEqual(got, local_run("-m", TINY, *RUN_ARGS, "-p", PROMPT))
        self.assertEqual(HUB.requests(server="cdn"), [])
        self.assertEqual(resolve_requests("vlm-test/tiny", "GET"), [])

    def test_tokenize_fetches_no_weights(self):
        """`vlm tokenize -m NAME` fetches the checkpoint's files but its *.safetensors and prints
        what it prints on the local folder; a later `vlm run` fetches only the weights."""
        c = commit_of("vlm-test/tiny")
        args = ("--text", "How many squares are there?")
        got = self.sb.vlm("tokenize", "-m", "vlm-test/tiny", *args).stdout
        self.assertEqual(got, local_run_cmd("tokenize", "-m", TINY, *args))
        weights = {e.sha256 for p, e in c.files.items() if p.endswith(".safetensors")}
        self.assertEqual([b for b in cdn_gets() if b in weights], [])
        fetched = {resolved_path(e) for e in resolve_requests("vlm-test/tiny", "GET")}
        self.assertEqual(fetched, {p for p in wanted(c) if not p.endswith(".safetensors")})
        HUB.reset()
        self.sb.vlm("run", "-m", "vlm-test/tiny", *RUN_ARGS, "-p", PROMPT)
        fetched = {resolved_path(e) for e in resolve_requests("vlm-test/tiny", "GET")}
        self.assertEqual(fetched, {p for p in wanted(c) if p.endswith(".safetensors")})

    def test_huggingface_hub_uses_what_vlm_wrote(self):
        """What vlm pulled is huggingface_hub's cache: hf_hub_download(local_files_only=True)
        returns vlm's files, scan_cache_dir reports the repo (commit, refs, files, size) with no
        warning, get_cached_repo_tree reads vlm's trees file, and an online snapshot_download
        then lists nothing and asks the hub only for the files vlm skipped."""
        c = commit_of("vlm-test/tiny")
        snap = self.sb.pull("vlm-test/tiny")
        with hf_quiet(self):
            for p in wanted(c):
                got = hf.hf_hub_download("vlm-test/tiny", p, cache_dir=self.sb.cache,
                                         local_files_only=True)
                self.assertEqual(Path(got), snap / p)
            scan = hf.scan_cache_dir(self.sb.cache)
            cached_tree = hf.get_cached_repo_tree("vlm-test/tiny", cache_dir=self.sb.cache)
        self.assertEqual((scan.warnings, len(scan.incomplete_files)), ([], 0))
        (repo,) = scan.repos
        (rev,) = repo.revisions
        blobs = self.sb.repo("vlm-test/tiny") / "blobs"
        self.assertEqual((repo.repo_id, rev.commit_hash, set(rev.refs), rev.nb_files, rev.snapshot_path),
                         ("vlm-test/tiny", MAIN, {"main"}, len(wanted(c)), snap))
        self.assertEqual(repo.size_on_disk, sum(b.stat().st_size for b in blobs.iterdir()))
        self.assertEqual({f.path: f.blob_id for f in cached_tree},
                         {p: e.blob_id for p, e in c.files.items()})
        HUB.reset()
        with hf_quiet(self):
            again = hf.snapshot_download("vlm-test/tiny", **hf_kw(self.sb.cache))
        self.assertEqual(Path(again), snap)
        self.assertEqual(HUB.requests(contains="/tree/"), [])
        self.assertEqual({resolved_path(e) for e in resolve_requests("vlm-test/tiny")},
                         set(c.files) - set(wanted(c)))
        self.assertEqual(hf.scan_cache_dir(self.sb.cache).warnings, [])

    def test_vlm_uses_what_huggingface_hub_wrote(self):
        """A model snapshot_download put in the cache runs by name without a download (online:
        no GET of a file, nothing from the CDN; with HF_HUB_OFFLINE=1 no request at all), and
        `vlm pull` prints the folder snapshot_download returned."""
        with hf_quiet(self):
            snap = hf.snapshot_download("vlm-test/tiny", **hf_kw(self.sb.cache))
        want = local_run("-m", TINY, *RUN_ARGS, "-p", PROMPT)
        HUB.reset()
        self.assertEqual(self.sb.vlm("run", "-m", "vlm-test/tiny", *RUN_ARGS, "-p", PROMPT).stdout, want)
        self.assertEqual((resolve_requests("vlm-test/tiny", "GET"), HUB.requests(server="cdn")), ([], []))
        self.assertEqual(self.sb.pull("vlm-test/tiny"), Path(snap))
        HUB.reset()
        got = self.sb.vlm("run", "-m", "vlm-test/tiny", *RUN_ARGS, "-p", PROMPT,
                          env={"HF_HUB_OFFLINE": "1"}).stdout
        self.assertEqual(got, want)
        self.assertEqual(HUB.log, [])

    def test_sharded_checkpoint_downloads_in_parallel(self):
        """A checkpoint in three shards and an index: the shards come from the CDN at the same
        time (the mock holds each until two are in flight), each once, and `vlm run` on it prints
        what `vlm run` prints on the unsharded checkpoint."""
        HUB.cdn_barrier = 2
        c = commit_of("vlm-test/sharded")
        path = self.sb.pull("vlm-test/sharded")
        self.assertEqual(path, self.sb.snapshot("vlm-test/sharded"))
        self.assert_snapshot(self.sb, "vlm-test/sharded", c, wanted(c))
        self.assertGreaterEqual(HUB.cdn_max_concurrent, 2)
        self.assertEqual(sorted(cdn_gets()), sorted(e.sha256 for e in c.files.values() if e.lfs))
        args = (*RUN_ARGS, "-p", "Hello there")
        self.assertEqual(self.sb.vlm("run", "-m", "vlm-test/sharded", *args).stdout,
                         local_run("-m", WORK / "fullvocab", *args))

    def test_cut_connection_resumed_in_the_same_run(self):
        """The CDN closes the connection after 3 MB of the 8 MB model: the same `vlm pull` asks
        for the rest with Range: bytes=N- (0 < N <= 3 MB) and the blob it keeps is the model's."""
        c = commit_of("vlm-test/tiny")
        model = c.files["model.safetensors"]
        k = 3_000_000
        HUB.add_fault("cut", repo="vlm-test/tiny", path="model.safetensors", at=k)
        self.sb.pull("vlm-test/tiny")
        gets = blob_requests("cdn", model.sha256)
        self.assertEqual((gets[0]["fault"], gets[0]["sent"]), ("cut", k))
        resumed = [int(m.group(1)) for g in gets[1:]
                   if (m := re.fullmatch(r"bytes=(\d+)-", g["range"] or ""))]
        self.assertTrue(resumed and 0 < resumed[0] <= k,
                        f"no resumed request: {[(g['range'], g['sent']) for g in gets]}")
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, wanted(c))

    def test_leftover_incomplete_resumed(self):
        """A blobs/<sha256>.incomplete holding the model's first half (an earlier run's) is
        resumed: one CDN request, for bytes=HALF-, and the blob is the model."""
        c = commit_of("vlm-test/tiny")
        model = c.files["model.safetensors"]
        half = model.size // 2
        blobs = self.sb.repo("vlm-test/tiny") / "blobs"
        blobs.mkdir(parents=True)
        (blobs / f"{model.sha256}.incomplete").write_bytes(model.data[:half])
        self.sb.pull("vlm-test/tiny")
        self.assertEqual([g["range"] for g in blob_requests("cdn", model.sha256)], [f"bytes={half}-"])
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, wanted(c))

    def test_server_without_ranges(self):
        """The CDN answers a resumed download's Range request with the whole file and 200: vlm
        starts the file over (its hash too) and keeps a correct blob."""
        c = commit_of("vlm-test/tiny")
        model = c.files["model.safetensors"]
        blobs = self.sb.repo("vlm-test/tiny") / "blobs"
        blobs.mkdir(parents=True)
        (blobs / f"{model.sha256}.incomplete").write_bytes(model.data[:model.size // 2])
        HUB.add_fault("norange", repo="vlm-test/tiny", path="model.safetensors", server="cdn")
        self.sb.pull("vlm-test/tiny")
        gets = blob_requests("cdn", model.sha256)
        self.assertEqual([(g["range"], g["fault"], g["sent"]) for g in gets],
                         [(f"bytes={model.size // 2}-", "norange", model.size)])
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, wanted(c))

    def test_range_not_satisfiable_starts_over(self):
        """A leftover .incomplete the server will not continue (416): vlm starts that file over
        from byte 0, once, and keeps a correct blob."""
        c = commit_of("vlm-test/tiny")
        model = c.files["model.safetensors"]
        blobs = self.sb.repo("vlm-test/tiny") / "blobs"
        blobs.mkdir(parents=True)
        (blobs / f"{model.sha256}.incomplete").write_bytes(model.data[:1000])
        HUB.add_fault("status", status=416, repo="vlm-test/tiny", path="model.safetensors",
                      server="cdn")
        self.sb.pull("vlm-test/tiny")
        self.assertEqual([g["range"] for g in blob_requests("cdn", model.sha256)],
                         ["bytes=1000-", None])
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, wanted(c))

    def test_files_sharing_a_blob_fetch_it_once(self):
        """Two paths with the same bytes (one blob): one download, both linked to it."""
        c = commit_of("vlm-test/dup")
        self.sb.pull("vlm-test/dup")
        self.assertEqual(len(resolve_requests("vlm-test/dup", "GET")), len(wanted(c)) - 1)
        self.assert_snapshot(self.sb, "vlm-test/dup", c, wanted(c))

    def test_two_pulls_at_once(self):
        """Two `vlm pull`s of one model into one cache at once (slowed to 4 MB/s, so that they
        overlap): both succeed and print the same snapshot; each blob is whole; the second
        waited on the first's lock rather than writing the same partial file."""
        c = commit_of("vlm-test/tiny")
        HUB.rate = 4e6
        procs = [subprocess.Popen([ARGS.vlm, "pull", "vlm-test/tiny"], env=self.sb.env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
            self.assertEqual(Path(out.strip().splitlines()[-1]), self.sb.snapshot("vlm-test/tiny"))
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, wanted(c), fresh=False)
        self.assertEqual(len(blob_requests("cdn", c.files["model.safetensors"].sha256)), 1)

    def test_corrupted_download_refused_then_clean_retry(self):
        """A flipped byte (in the LFS model from the CDN, checked by SHA-256; in config.json from
        the hub, checked by git SHA-1): `vlm pull` fails naming the file and a checksum, leaves
        neither the blob nor its .incomplete nor a link; the next pull (clean) succeeds."""
        c = commit_of("vlm-test/tiny")
        for path in ("model.safetensors", "config.json"):
            with self.subTest(path=path):
                HUB.reset()
                sb = Sandbox()
                e = c.files[path]
                HUB.add_fault("corrupt", repo="vlm-test/tiny", path=path, at=e.size // 3)
                r = sb.vlm("pull", "vlm-test/tiny", rc=1)
                self.assert_fails(r, "checksum", path)
                self.assertEqual(HUB.faults[0].fired, 1)
                blobs = sb.repo("vlm-test/tiny") / "blobs"
                self.assertFalse((blobs / e.etag).exists())
                self.assertFalse((blobs / f"{e.etag}.incomplete").exists())
                self.assertFalse(os.path.lexists(sb.repo("vlm-test/tiny") / "snapshots" / MAIN / path))
                sb.pull("vlm-test/tiny")
                self.assert_snapshot(sb, "vlm-test/tiny", c, wanted(c), fresh=False)

    def test_offline(self):
        """HF_HUB_OFFLINE=1: a model not in the cache fails (pull and run) saying offline, with
        no request; once pulled, pull and run work from the cache with no request at all."""
        off = {"HF_HUB_OFFLINE": "1"}
        self.assert_fails(self.sb.vlm("pull", "vlm-test/tiny", rc=1, env=off), "offline")
        r = self.sb.vlm("run", "-m", "vlm-test/tiny", *RUN_ARGS, "-p", PROMPT, rc=1, env=off)
        self.assert_fails(r, "offline")
        self.assertEqual(HUB.log, [])
        path = self.sb.pull("vlm-test/tiny")
        HUB.reset()
        self.assertEqual(self.sb.pull("vlm-test/tiny", env=off), path)
        got = self.sb.vlm("run", "-m", "vlm-test/tiny", *RUN_ARGS, "-p", PROMPT, env=off).stdout
        self.assertEqual(got, local_run("-m", TINY, *RUN_ARGS, "-p", PROMPT))
        self.assertEqual(HUB.log, [])

    def test_gated_repo_and_tokens(self):
        """A gated repo: without a token the hub's 401 becomes an error naming the gate, the
        repo's page and HF_TOKEN; a token not granted (403) fails too; nothing is downloaded.
        The granted token works from --hf-token (over HF_TOKEN), HF_TOKEN (over the token file),
        the file HF_TOKEN_PATH, and $HF_HOME/token (trailing newline stripped); it goes to the
        hub as Authorization: Bearer, never to the CDN."""
        r = self.sb.vlm("pull", "vlm-test/gated", rc=1)
        self.assert_fails(r, "gated", f"{HUB.endpoint}/vlm-test/gated", "HF_TOKEN")
        self.assertIn(401, {e["status"] for e in resolve_requests("vlm-test/gated")})
        r = self.sb.vlm("pull", "vlm-test/gated", rc=1, env={"HF_TOKEN": OTHER_TOKEN})
        self.assert_fails(r, "gated")
        self.assertIn(403, {e["status"] for e in resolve_requests("vlm-test/gated")})
        self.assertEqual(HUB.requests(server="cdn"), [])
        blobs = self.sb.repo("vlm-test/gated") / "blobs"
        self.assertEqual(sorted(b.name for b in blobs.iterdir()) if blobs.exists() else [], [],
                         "left in blobs/")

        c = commit_of("vlm-test/gated")
        token_file = WORK / "token-file"
        token_file.write_text(TOKEN)
        ways = {
            "--hf-token": (["--hf-token", TOKEN], {"HF_TOKEN": OTHER_TOKEN}, None),
            "HF_TOKEN": ([], {"HF_TOKEN": TOKEN}, OTHER_TOKEN),
            "HF_TOKEN_PATH": ([], {"HF_TOKEN_PATH": str(token_file)}, OTHER_TOKEN),
            "$HF_HOME/token": ([], {}, TOKEN + "\n"),
        }
        for way, (args, env, home_token) in ways.items():
            with self.subTest(way=way):
                HUB.reset()
                sb = Sandbox()
                if home_token is not None:
                    (sb.home / "token").write_text(home_token)
                self.assertEqual(sb.pull("vlm-test/gated", *args, env=env), sb.snapshot("vlm-test/gated"))
                self.assert_snapshot(sb, "vlm-test/gated", c, wanted(c))
                auths = {e["authorization"] for e in HUB.requests(server="hub")}
                self.assertIn(f"Bearer {TOKEN}", auths)
                self.assertTrue(auths <= {f"Bearer {TOKEN}", None}, auths)
                self.assertTrue(HUB.requests(server="cdn", method="GET"))
                self.assert_no_cdn_auth()
        HUB.reset()
        got = Sandbox().vlm("run", "-m", "vlm-test/gated", "--hf-token", TOKEN, *RUN_ARGS,
                            "-p", PROMPT).stdout
        self.assertEqual(got, local_run("-m", TINY, *RUN_ARGS, "-p", PROMPT))
        self.assert_no_cdn_auth()

    def test_invalid_token_reported(self):
        """A token the hub does not know (it answers 401 "Invalid credentials in Authorization
        header" to everything, public repos too) fails the pull with a message about the token."""
        r = self.sb.vlm("pull", "vlm-test/tiny", rc=1, env={"HF_TOKEN": "hf_expired_token"})
        self.assert_fails(r, "refused the token", "HF_TOKEN")

    def test_revision_pinned_by_commit_and_tag(self):
        """`@<old commit>` downloads that commit's files (not main's) into snapshots/<old>, with no
        refs file naming it, and runs as the local copy of that commit does; `@v1.0` (a tag on it)
        resolves to the same snapshot, recorded in refs/v1.0, with nothing downloaded again."""
        old = commit_of("vlm-test/tiny", OLD)
        path = self.sb.pull(f"vlm-test/tiny@{OLD}")
        repo = self.sb.repo("vlm-test/tiny")
        self.assertEqual(path, repo / "snapshots" / OLD)
        self.assert_snapshot(self.sb, "vlm-test/tiny", old, wanted(old))
        refs = repo / "refs"
        self.assertEqual([p for p in refs.rglob("*") if p.is_file()] if refs.exists() else [], [])
        args = (*RUN_ARGS, "-p", PROMPT)
        self.assertEqual(self.sb.vlm("run", "-m", f"vlm-test/tiny@{OLD}", *args).stdout,
                         local_run("-m", TINY_VL, *args))
        HUB.reset()
        self.assertEqual(self.sb.pull("vlm-test/tiny@v1.0"), path)
        self.assertEqual((refs / "v1.0").read_text(), OLD)
        self.assertEqual(HUB.requests(server="cdn"), [])

    def test_unknown_revision(self):
        """A branch, or a commit hash, the repo does not have: an error about the revision."""
        for rev in ("no-such-branch", "0123456789abcdef0123456789abcdef01234567"):
            with self.subTest(rev=rev):
                self.assert_fails(self.sb.vlm("pull", f"vlm-test/tiny@{rev}", rc=1), "revision")

    def test_unknown_repo(self):
        """A repo the hub does not have (401 without a token, 404 with one): "not found"."""
        self.assert_fails(self.sb.vlm("pull", "vlm-test/nope", rc=1), "not found")
        r = self.sb.vlm("pull", "vlm-test/nope", rc=1, env={"HF_TOKEN": OTHER_TOKEN})
        self.assert_fails(r, "not found")

    def test_hostile_tree_path_refused(self):
        """A tree listing whose path climbs out of the snapshot ("../../../x.gguf") is refused
        before anything is fetched or written outside the cache."""
        r = self.sb.vlm("pull", "vlm-test/hostile:Q8_0", rc=1)
        self.assert_fails(r, "inside the repository")
        self.assertEqual(resolve_requests("vlm-test/hostile"), [])
        written = [p for p in self.sb.root.rglob("*") if "escaped" in p.name]
        self.assertEqual(written, [])

    def test_disk_space_refused_before_download(self):
        """A file bigger than the free disk (2**60 bytes, by the tree and X-Linked-Size) is refused
        before any request to the CDN, and nothing of it is written."""
        self.assert_fails(self.sb.vlm("pull", "vlm-test/huge", rc=1), "disk space")
        self.assertEqual(HUB.requests(server="cdn"), [])
        huge = commit_of("vlm-test/huge").files["model.safetensors"]
        blobs = self.sb.repo("vlm-test/huge") / "blobs"
        self.assertEqual([b.name for b in blobs.glob(huge.sha256 + "*")] if blobs.exists() else [], [])

    def test_no_space_left(self):
        """A write that fails (the model's .incomplete is a link to /dev/full) is an error that
        says there is no space left."""
        self.assertTrue(stat.S_ISCHR(os.stat("/dev/full").st_mode))
        model = commit_of("vlm-test/tiny").files["model.safetensors"]
        blobs = self.sb.repo("vlm-test/tiny") / "blobs"
        blobs.mkdir(parents=True)
        (blobs / f"{model.sha256}.incomplete").symlink_to("/dev/full")
        self.assert_fails(self.sb.vlm("pull", "vlm-test/tiny", rc=1), "no space left")

    def test_cache_location_from_environment(self):
        """Where the cache is: HF_HUB_CACHE; else $HF_HOME/hub; else
        $XDG_CACHE_HOME/huggingface/hub; else ~/.cache/huggingface/hub."""
        r = self.sb.root
        unset = {"HF_HUB_CACHE": None, "HF_HOME": None}
        cases = {
            "HF_HUB_CACHE": ({"HF_HUB_CACHE": str(r / "a")}, r / "a"),
            "HF_HOME": ({"HF_HUB_CACHE": None, "HF_HOME": str(r / "b")}, r / "b/hub"),
            "XDG_CACHE_HOME": ({**unset, "XDG_CACHE_HOME": str(r / "c")}, r / "c/huggingface/hub"),
            "HOME": ({**unset, "HOME": str(r / "d")}, r / "d/.cache/huggingface/hub"),
        }
        for name, (env, cache) in cases.items():
            with self.subTest(variable=name):
                self.assertEqual(self.sb.pull("vlm-test/tiny", env=env),
                                 repo_folder(cache, "vlm-test/tiny") / "snapshots" / MAIN)

    def test_existing_path_wins(self):
        """A folder that exists is the model even when its path reads as a name: `-m vlm-test/tiny`
        in a directory holding vlm-test/tiny (a copy of the Qwen3-VL demo) runs that folder, with
        no request to the hub."""
        (self.sb.root / "vlm-test").mkdir()
        (self.sb.root / "vlm-test/tiny").symlink_to(TINY_VL)
        got = self.sb.vlm("run", "-m", "vlm-test/tiny", *RUN_ARGS, "-p", PROMPT, cwd=self.sb.root).stdout
        self.assertEqual(got, local_run("-m", TINY_VL, *RUN_ARGS, "-p", PROMPT))
        self.assertEqual(HUB.log, [])

    def test_serve_by_name(self):
        """`vlm serve -m vlm-test/gated --hf-token T` downloads the model (the token to the hub, not
        the CDN) and answers a chat as `vlm run` on the local folder does."""
        log = open(self.sb.root / "serve.log", "w+")
        proc = subprocess.Popen([ARGS.vlm, "serve", "-m", "vlm-test/gated", "--hf-token", TOKEN,
                                 "--port", "0", "-t", "2", "--served-model-name", "tiny", "-c", "512"],
                                env=self.sb.env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            port = None
            for _ in range(600):
                m = re.search(r"serving on http://[^\s:]+:(\d+)", (self.sb.root / "serve.log").read_text())
                if m:
                    port = int(m.group(1))
                    break
                if proc.poll() is not None:
                    break
                time.sleep(0.1)
            self.assertIsNotNone(port, (self.sb.root / "serve.log").read_text())
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            for _ in range(600):  # up once /health answers 200 (503 while it loads)
                try:
                    with opener.open(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError):
                    pass
                self.assertIsNone(proc.poll(), (self.sb.root / "serve.log").read_text())
                time.sleep(0.1)
            body = {"model": "tiny", "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": PROMPT}]}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with opener.open(req, timeout=TIMEOUT) as r:
                reply = json.loads(r.read())["choices"][0]["message"]["content"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
        self.assertEqual(reply, local_run("-m", TINY, *RUN_ARGS, "-p", PROMPT).rstrip("\n"))
        self.assertTrue((self.sb.snapshot("vlm-test/gated") / "model.safetensors").exists())
        self.assertIn(f"Bearer {TOKEN}", {e["authorization"] for e in resolve_requests("vlm-test/gated")})
        self.assert_no_cdn_auth()

    def test_progress_in_a_pipe(self):
        """stderr a pipe: no carriage return, a line naming each file downloaded."""
        c = commit_of("vlm-test/tiny")
        err = self.sb.vlm("pull", "vlm-test/tiny").stderr
        self.assertNotIn("\r", err)
        for p in wanted(c):
            self.assertIn(p.rsplit("/", 1)[-1], err)

    def test_progress_on_a_terminal(self):
        """stderr a terminal (a pty, no output processing, 100 columns): a bar redrawn in place
        (a carriage return not ending a line) with a percentage, while the 8 MB come at 8 MB/s."""
        HUB.rate = 8e6
        master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        proc = subprocess.Popen([ARGS.vlm, "pull", "vlm-test/tiny"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=slave, env=self.sb.env(TERM="xterm-256color"))
        os.close(slave)
        chunks = []

        def read():
            while True:
                try:
                    b = os.read(master, 65536)
                except OSError:  # EIO: the child's end is closed
                    return
                if not b:
                    return
                chunks.append(b)
        reader = threading.Thread(target=read)
        reader.start()
        out, _ = proc.communicate(timeout=TIMEOUT)
        reader.join(10)
        os.close(master)
        err = b"".join(chunks).decode(errors="replace")
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(Path(out.decode().strip().splitlines()[-1]), self.sb.snapshot("vlm-test/tiny"))
        self.assertRegex(err, r"\r(?!\n)")
        self.assertRegex(err, r"\d%")


class VlmGguf(VlmTestCase):
    """A GGUF repo laid out as llama.cpp's are (tiny-F32.gguf, tiny-Q8_0.gguf,
    mmproj-tiny-F32.gguf, a card), written from the Qwen3-VL demo by scripts/write_gguf.py."""

    @classmethod
    def setUpClass(cls):
        need_vlm()
        cls.dir = WORK / "gguf"
        cls.dir.mkdir(exist_ok=True)
        for qtype in ("f32", "q8_0"):
            subprocess.run([sys.executable, str(REPO / "scripts/write_gguf.py"), str(TINY_VL),
                            str(cls.dir / f"w-{qtype}"), "--type", qtype], check=True)
        cls.files = {"tiny-F32.gguf": cls.dir / "w-f32.gguf",
                     "tiny-Q8_0.gguf": cls.dir / "w-q8_0.gguf",
                     "mmproj-tiny-F32.gguf": cls.dir / "w-f32-mmproj.gguf"}
        HUB.add_repo(Repo("vlm-test/tiny-gguf")).commit(
            {**{k: v.read_bytes() for k, v in cls.files.items()}, "README.md": b"# tiny GGUF\n"})
        HUB.add_repo(Repo("vlm-test/tiny-gguf-f32")).commit(
            {k: cls.files[k].read_bytes() for k in ("tiny-F32.gguf", "mmproj-tiny-F32.gguf")})

    def test_quant_tag_fetches_one_model_file_and_its_mmproj(self):
        """`:Q8_0` fetches tiny-Q8_0.gguf and the mmproj, nothing else, and prints the .gguf's
        snapshot path; `:q8_0` is the same file; no tag picks Q8_0 here (no Q4_K_M); `:F32` picks
        tiny-F32.gguf, not the mmproj that also reads F32; a repo with neither default falls
        back to its one model file."""
        c = commit_of("vlm-test/tiny-gguf")
        snap = self.sb.snapshot("vlm-test/tiny-gguf")
        pair = ["tiny-Q8_0.gguf", "mmproj-tiny-F32.gguf"]
        self.assertEqual(self.sb.pull("vlm-test/tiny-gguf:Q8_0"), snap / "tiny-Q8_0.gguf")
        self.assert_snapshot(self.sb, "vlm-test/tiny-gguf", c, pair)
        asked = {resolved_path(e) for e in resolve_requests("vlm-test/tiny-gguf")}
        self.assertEqual(asked - set(pair), set())
        HUB.reset()
        self.assertEqual(self.sb.pull("vlm-test/tiny-gguf:q8_0"), snap / "tiny-Q8_0.gguf")
        self.assertEqual(self.sb.pull("vlm-test/tiny-gguf"), snap / "tiny-Q8_0.gguf")
        self.assertEqual(HUB.requests(server="cdn"), [])
        self.assertEqual(self.sb.pull("vlm-test/tiny-gguf:F32"), snap / "tiny-F32.gguf")
        self.assertEqual(cdn_gets(), [c.files["tiny-F32.gguf"].sha256])
        self.assert_snapshot(self.sb, "vlm-test/tiny-gguf", c, [*pair, "tiny-F32.gguf"])
        self.assertEqual(self.sb.pull("vlm-test/tiny-gguf-f32"),
                         self.sb.snapshot("vlm-test/tiny-gguf-f32") / "tiny-F32.gguf")

    def test_unknown_quant_lists_what_exists(self):
        """`:Q5_K_M`, which the repo lacks: an error naming it and the quantizations there are,
        before any download."""
        r = self.sb.vlm("pull", "vlm-test/tiny-gguf:Q5_K_M", rc=1)
        self.assert_fails(r, "Q5_K_M", "Q8_0", "F32")
        self.assertEqual(HUB.requests(server="cdn"), [])

    def test_run_by_name_with_an_image(self):
        """`vlm run -m vlm-test/tiny-gguf:TAG --image ...` (the mmproj found and passed by itself)
        answers as `vlm run -m tiny-TAG.gguf --mmproj mmproj-tiny-F32.gguf --image ...` does."""
        case = json.loads((SCENES / "cases-tiny-qwen3vl.json").read_text())["cases"][1]
        ask = ["--greedy", "-n", "32", "-t", "2", "--image", str(SCENES / case["image"]),
               "--min-pixels", str(MIN_PIXELS), "--max-pixels", str(MAX_PIXELS), "-p", case["question"]]
        for tag in ("F32", "Q8_0"):
            with self.subTest(tag=tag):
                got = self.sb.vlm("run", "-m", f"vlm-test/tiny-gguf:{tag}", *ask).stdout
                want = local_run("-m", self.files[f"tiny-{tag}.gguf"],
                                 "--mmproj", self.files["mmproj-tiny-F32.gguf"], *ask)
                self.assertEqual(got, want)


class VlmCacheCommands(VlmTestCase):
    """`vlm ls` and `vlm rm` on a cache vlm filled, checked against huggingface_hub's scan."""

    def ls(self) -> list:
        return json.loads(self.sb.vlm("ls", "--json").stdout)

    def test_ls_json_agrees_with_scan_cache_dir(self):
        """Two revisions of one repo and another repo: `vlm ls --json` gives each repo's folder,
        its size on disk (each blob once), and per revision the commit, refs, snapshot, file
        count and size, as scan_cache_dir reports them."""
        self.sb.pull("vlm-test/tiny")
        self.sb.pull(f"vlm-test/tiny@{OLD}")
        self.sb.pull("vlm-test/sharded")
        listed = self.ls()
        scan = {r.repo_id: r for r in hf.scan_cache_dir(self.sb.cache).repos}
        self.assertEqual(sorted(m["name"] for m in listed), ["vlm-test/sharded", "vlm-test/tiny"])
        for m in listed:
            r = scan[m["name"]]
            self.assertEqual((Path(m["path"]), m["size"]), (r.repo_path, r.size_on_disk), m["name"])
            self.assertEqual(m["size"], sum(b.stat().st_size for b in (r.repo_path / "blobs").iterdir()))
            got = {v["commit"]: (sorted(v["refs"]), Path(v["path"]), v["files"], v["size"])
                   for v in m["revisions"]}
            want = {v.commit_hash: (sorted(v.refs), v.snapshot_path, v.nb_files, v.size_on_disk)
                    for v in r.revisions}
            self.assertEqual(got, want, m["name"])
        self.assertEqual(len(next(m for m in listed if m["name"] == "vlm-test/tiny")["revisions"]), 2)
        table = self.sb.vlm("ls").stdout  # the table for people: each repo named
        for m in listed:
            self.assertIn(m["name"], table)

    def test_rm_one_revision(self):
        """`vlm rm vlm-test/tiny@v1.0` removes that revision: its snapshot, the ref naming it,
        the blobs main does not share; main stays whole and scan_cache_dir finds nothing wrong.
        `@<commit>` removes a revision the same way."""
        self.sb.pull("vlm-test/tiny")
        self.sb.pull("vlm-test/tiny@v1.0")
        repo = self.sb.repo("vlm-test/tiny")
        def blobs_of(commit):
            return {os.path.basename(os.readlink(p)) for p in (repo / "snapshots" / commit).rglob("*")
                    if p.is_symlink()}
        main_blobs, old_blobs = blobs_of(MAIN), blobs_of(OLD)
        self.assertTrue(old_blobs - main_blobs and old_blobs & main_blobs)  # some blobs shared, some not
        self.sb.vlm("rm", "vlm-test/tiny@v1.0")
        self.assertFalse((repo / "snapshots" / OLD).exists())
        self.assertFalse((repo / "refs/v1.0").exists())
        self.assertEqual((repo / "refs/main").read_text(), MAIN)
        self.assertEqual({b.name for b in (repo / "blobs").iterdir()}, main_blobs)
        c = commit_of("vlm-test/tiny")
        self.assert_snapshot(self.sb, "vlm-test/tiny", c, wanted(c), fresh=False)
        scan = hf.scan_cache_dir(self.sb.cache)
        self.assertEqual(scan.warnings, [])
        self.assertEqual([v.commit_hash for r in scan.repos for v in r.revisions], [MAIN])
        self.sb.pull(f"vlm-test/tiny@{OLD}")
        self.sb.vlm("rm", f"vlm-test/tiny@{OLD}")
        self.assertFalse((repo / "snapshots" / OLD).exists())
        self.assertEqual({b.name for b in (repo / "blobs").iterdir()}, main_blobs)
        self.assertEqual([m["revisions"][0]["commit"] for m in self.ls()], [MAIN])

    def test_rm_whole_repo(self):
        """`vlm rm vlm-test/tiny` removes its folder and its .locks folder; another repo stays,
        and scan_cache_dir lists it alone with no warning."""
        self.sb.pull("vlm-test/tiny")
        self.sb.pull(f"vlm-test/tiny@{OLD}")
        self.sb.pull("vlm-test/sharded")
        self.sb.vlm("rm", "vlm-test/tiny")
        self.assertFalse(self.sb.repo("vlm-test/tiny").exists())
        self.assertFalse((self.sb.cache / ".locks" / self.sb.repo("vlm-test/tiny").name).exists())
        scan = hf.scan_cache_dir(self.sb.cache)
        self.assertEqual((scan.warnings, [r.repo_id for r in scan.repos]), ([], ["vlm-test/sharded"]))
        self.assertEqual([m["name"] for m in self.ls()], ["vlm-test/sharded"])

    def test_rm_not_cached(self):
        """A repo, or a revision, the cache does not hold: exit 1, "not in the cache", nothing
        removed."""
        self.assert_fails(self.sb.vlm("rm", "vlm-test/nope", rc=1), "not in the cache")
        path = self.sb.pull("vlm-test/tiny")
        self.assert_fails(self.sb.vlm("rm", "vlm-test/tiny:Q8_0", rc=1), "not one GGUF file")
        self.assert_fails(self.sb.vlm("rm", f"vlm-test/tiny@{OLD}", rc=1), "not in the cache")
        self.assertTrue((path / "model.safetensors").exists())


def main():
    global FULLVOCAB
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlm", help="the vlm binary (needed by all but MockIsFaithful)")
    ap.add_argument("--model-dir", type=Path, default=FULLVOCAB,
                    help="tests/model/fixtures/tiny-fullvocab-bf16 (the sharded checkpoint's source)")
    args, rest = ap.parse_known_args()
    if args.vlm:
        ARGS.vlm = str(Path(args.vlm).resolve())
    FULLVOCAB = args.model_dir.resolve()
    for k in ("NO_PROXY", "no_proxy"):  # the mock is on 127.0.0.1, whatever proxy CI sets
        hosts = [os.environ.get(k, ""), "127.0.0.1", "localhost"]
        os.environ[k] = BASE_ENV[k] = ",".join(filter(None, hosts))
    unittest.main(module="__main__", argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
