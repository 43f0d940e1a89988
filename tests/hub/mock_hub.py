"""A local stand-in for the Hugging Face Hub's HTTP API, and for the CDN its large files come from.

Two stdlib HTTP servers on 127.0.0.1 (ports chosen by the system): the hub (`MockHub.endpoint`,
what HF_ENDPOINT names) and the CDN (`MockHub.cdn_endpoint`), another origin, as the real hub's
LFS files live on another host. What they answer is what huggingface_hub 2.4 reads (file_download.py,
_snapshot_download.py, hf_api.py, utils/_http.py's hf_raise_for_status, utils/_pagination.py);
tests/hub/hub_test.py's MockIsFaithful runs huggingface_hub itself against it.

Hub routes (REPO is ORG/NAME; REV a branch, a tag or a 40-hex commit, URL-quoted):
  GET  /api/models/REPO[/revision/REV][?blobs=true]   the repo's info: id, sha, siblings, gated...
  GET  /api/models/REPO/tree/REV[/PATH][?recursive=true&expand=false&cursor=C]
       the tree, `page_size` entries a page, the next page named by a `Link: <url>; rel="next"`
  HEAD|GET /REPO/resolve/REV/PATH
       a regular file: 200, ETag "<git blob sha1>", Content-Length, the bytes (Range: 206);
       an LFS file (*.safetensors, *.gguf, *.bin, *.pth, *.pt): 302 to the CDN with X-Linked-Etag
       "<sha256>" and X-Linked-Size (its own ETag is the redirect's, weak, as a client must prefer
       X-Linked-Etag). Both carry X-Repo-Commit.
CDN route: HEAD|GET /repos/ORG/NAME/SHA256?name=FILE&expires=T&sig=S, the signed URL the hub's 302
hands out (cdn-lfs.hf.co's name the repo and the blob); a wrong signature is 403; Range: 206. It
answers 400 to a request that carries an Authorization header (`cdn_reject_auth`, default on), as
S3 does to a presigned URL sent with credentials; either way the log records it.

Errors as the hub gives them, in X-Error-Code / X-Error-Message (and {"error": ...} in a GET's body):
  unknown (or private, without access) repo: 401 RepoNotFound "Invalid username or password."
  without a token, 404 RepoNotFound "Repository not found" with one; unknown revision: 404
  RevisionNotFound "Invalid rev id: REV"; unknown file: 404 EntryNotFound (with X-Repo-Commit);
  a gated repo's files: 401 GatedRepo without a token, 403 GatedRepo with a token not granted;
  a token the hub does not know (`valid_tokens`, when set): 401 "Invalid credentials in
  Authorization header", on every route. A gated repo's info and tree answer without a token.

Repos: `Repo(repo_id, gated=False|"manual", private=False, granted={tokens})`, `.commit({path:
bytes | HugeFile}, branch="main") -> sha` (deterministic), `.tag(name, revision)`;
`Repo.from_folder(repo_id, dir, extra={...})`. LFS files: *.safetensors, *.gguf, *.bin, *.pth, *.pt
(tree "oid" the git oid of the LFS pointer, "lfs": {"oid": sha256, "size", "pointerSize"}); each
commit gets a .gitattributes as on the hub. `HugeFile(size)` claims `size` bytes (in the tree and
X-Linked-Size) and is never served (the CDN answers 500 and logs the attempt).

MockHub(repos, page_size=3, valid_tokens=None, cdn_reject_auth=True): `start()` (returns it),
`stop()`, `endpoint` and `cdn_endpoint` ("http://127.0.0.1:PORT"), `add_repo(repo)`, `repos`
(by id), `reset()` (log, faults, barrier, rate, concurrency record back to their start).

Faults (`MockHub.faults`, a list of `Fault`s, or `add_fault(kind, path=, blob=, repo=, server=,
at=, status=, times=1)`), on a GET's body wherever it is served (the hub for regular files, the
CDN for LFS ones): "cut" sends the headers with the full Content-Length, then `at` bytes of the
body (default half), then closes the connection (FIN); "corrupt" flips the byte at file offset
`at` (same size); "status" answers `status` instead; "norange" answers a Range request with the
whole file and 200, as a server that does not do ranges. Each fires `times` times (None: always);
`Fault.fired` counts. `cdn_barrier = N` holds each CDN GET until N are in flight (or
`barrier_timeout` seconds, 3, pass); `cdn_max_concurrent` is the most CDN GETs ever in flight at
once. `rate` (bytes per second) slows every body down.

Every request is logged in `MockHub.log` (and `requests(server=, method=, contains=)` filters it):
dicts with server ("hub"/"cdn"), method, path (decoded), raw_path, query, range (the Range header
or None), auth (bool), authorization (the header or None), and once answered status, sent (body
bytes written) and fault (the one that fired, if any).

    hub = MockHub([Repo.from_folder("org/name", "models/tiny-qwen35")]).start()
    ... HF_ENDPOINT=hub.endpoint ...
    hub.stop()

Manual use: python3 mock_hub.py --serve DIR... [--org ORG] [--gated TOKEN]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import http.server
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pth", ".pt")

# What the hub writes into a new repository's .gitattributes (abridged): the LFS patterns.
GITATTRIBUTES = b"".join(b"*%s filter=lfs diff=lfs merge=lfs -text\n" % s.encode() for s in LFS_SUFFIXES)

DATE = "2025-01-01T00:00:00.000Z"


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the hub's tree calls `oid` and its ETag for regular files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The Git LFS pointer file git stores in place of an LFS file."""
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n").encode()


def is_lfs(path: str) -> bool:
    return path.lower().endswith(LFS_SUFFIXES)


class HugeFile:
    """A file that claims `size` bytes: listed and resolved with that size, never served."""

    def __init__(self, size: int, seed: str = "huge"):
        self.size = size
        self.sha256 = hashlib.sha256(f"mock-hub {seed} {size}".encode()).hexdigest()


@dataclass
class Entry:
    """One file of a commit."""
    path: str
    data: bytes | None  # None for a HugeFile
    size: int
    lfs: bool
    sha256: str | None  # LFS files
    blob_id: str  # git oid: of the content, or of the LFS pointer for an LFS file
    huge: bool = False

    @property
    def etag(self) -> str:
        """What huggingface_hub names the blob by: the sha256 for LFS files, else the git sha1."""
        return self.sha256 if self.lfs else self.blob_id

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size)) if self.lfs else 0

    @classmethod
    def make(cls, path: str, content: bytes | HugeFile) -> "Entry":
        if isinstance(content, HugeFile):
            return cls(path, None, content.size, True, content.sha256,
                       git_blob_sha1(lfs_pointer(content.sha256, content.size)), huge=True)
        if is_lfs(path):
            sha = hashlib.sha256(content).hexdigest()
            return cls(path, content, len(content), True, sha,
                       git_blob_sha1(lfs_pointer(sha, len(content))))
        return cls(path, content, len(content), False, None, git_blob_sha1(content))


@dataclass
class Commit:
    sha: str
    files: dict[str, Entry]
    parent: str | None
    message: str

    def directories(self) -> set[str]:
        dirs = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return dirs

    def tree_oid(self, directory: str) -> str:
        prefix = directory + "/"
        listing = "".join(f"{p} {e.blob_id}\n" for p, e in sorted(self.files.items()) if p.startswith(prefix))
        return hashlib.sha1(b"tree " + listing.encode()).hexdigest()


class Repo:
    """A model repository: commits (each a dict path -> bytes), branches and tags.

    gated: False, "manual" or "auto" (its files need a token in `granted`); private: True hides
    the repo from anyone without a granted token. Each commit gets a .gitattributes, as on the hub,
    unless `gitattributes=False`."""

    def __init__(self, repo_id: str, *, gated: bool | str = False, private: bool = False,
                 granted: set[str] | tuple = (), gitattributes: bool = True):
        if repo_id.count("/") != 1:
            raise ValueError(f"repo id {repo_id!r} is not ORG/NAME")
        self.repo_id = repo_id
        self.gated = gated
        self.private = private
        self.granted = set(granted)
        self.gitattributes = gitattributes
        self.commits: dict[str, Commit] = {}
        self.history: list[str] = []
        self.branches: dict[str, str] = {}
        self.tags: dict[str, str] = {}

    def commit(self, files: dict[str, bytes | HugeFile], branch: str = "main", message: str = "") -> str:
        """Adds a commit holding exactly `files` on `branch`; returns its sha (deterministic: a
        sha1 of the parent, the message and the listing)."""
        files = dict(files)
        if self.gitattributes and ".gitattributes" not in files:
            files[".gitattributes"] = GITATTRIBUTES
        entries = {p: Entry.make(p, c) for p, c in files.items()}
        parent = self.branches.get(branch)
        listing = "".join(f"{p} {e.blob_id}\n" for p, e in sorted(entries.items()))
        text = f"commit\nrepo {self.repo_id}\nparent {parent}\n{message}\n{listing}"
        sha = hashlib.sha1(text.encode()).hexdigest()
        self.commits[sha] = Commit(sha, entries, parent, message or f"commit {len(self.history) + 1}")
        self.history.append(sha)
        self.branches[branch] = sha
        return sha

    def tag(self, name: str, revision: str) -> None:
        self.tags[name] = self.resolve(revision).sha

    def resolve(self, revision: str) -> Commit | None:
        sha = self.branches.get(revision) or self.tags.get(revision)
        if sha is None and re.fullmatch(r"[0-9a-f]{40}", revision):
            sha = revision
        return self.commits.get(sha) if sha else None

    @classmethod
    def from_folder(cls, repo_id: str, folder: str | Path, extra: dict | None = None, **kw) -> "Repo":
        """A repo whose main branch has one commit: the folder's files (recursively) and `extra`."""
        repo = cls(repo_id, **kw)
        repo.commit({**read_folder(folder), **(extra or {})})
        return repo


def read_folder(folder: str | Path) -> dict[str, bytes]:
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@dataclass
class Fault:
    """A fault on the body of a GET. Matches by `path` (a repo file path; on the CDN, any path of
    the repo with that blob), `blob` (its etag), `repo` and `server` ("hub"/"cdn"); the fields left
    None match anything."""
    kind: str  # "cut", "corrupt", "status" or "norange"
    path: str | None = None
    blob: str | None = None
    repo: str | None = None
    server: str | None = None
    at: int | None = None  # cut: body bytes sent (default half); corrupt: file offset (default middle)
    status: int = 503
    times: int | None = 1  # None: every time
    fired: int = 0

    def matches(self, server: str, keys: list[tuple[str, str]], etag: str) -> bool:
        if self.times is not None and self.fired >= self.times:
            return False
        if self.server is not None and self.server != server:
            return False
        if self.blob is not None and self.blob != etag:
            return False
        return any((self.repo is None or self.repo == r) and (self.path is None or self.path == p)
                   for r, p in keys)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "MockHub/1.0"

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionError, socket.timeout, OSError):
            pass

    def do_GET(self):
        self.server.mock._handle(self, self.server.role, "GET")

    def do_HEAD(self):
        self.server.mock._handle(self, self.server.role, "HEAD")

    def _not_allowed(self):
        self.server.mock._handle(self, self.server.role, self.command)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class _Reply:
    def __init__(self, status: int, headers: dict | None = None, body: bytes = b""):
        self.status = status
        self.headers = dict(headers or {})
        self.body = body
        self.file: tuple | None = None  # (Entry, start, end, keys): a file's bytes as the body


class MockHub:
    """The hub and its CDN; see the module's docstring."""

    def __init__(self, repos=(), *, page_size: int = 3, valid_tokens: set[str] | None = None,
                 cdn_reject_auth: bool = True):
        self.repos: dict[str, Repo] = {}
        self.page_size = page_size
        self.valid_tokens = valid_tokens  # None: any token is some user's
        self.cdn_reject_auth = cdn_reject_auth
        self.log: list[dict] = []
        self.faults: list[Fault] = []
        self.cdn_barrier = 0
        self.barrier_timeout = 3.0
        self.cdn_max_concurrent = 0
        self.rate: float | None = None
        self._secret = os.urandom(16)
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._cdn_inflight = 0
        self._servers: list[_Server] = []
        self.endpoint = self.cdn_endpoint = None
        for r in repos:
            self.add_repo(r)

    # ---- set-up ----

    def add_repo(self, repo: Repo) -> Repo:
        with self._lock:
            self.repos[repo.repo_id] = repo
        return repo

    def add_fault(self, kind: str, **kw) -> Fault:
        f = Fault(kind, **kw)
        with self._lock:
            self.faults.append(f)
        return f

    def reset(self) -> None:
        """Forgets the log, the faults, the concurrency record; barrier and rate off."""
        with self._lock:
            self.log.clear()
            self.faults.clear()
        self.cdn_barrier = 0
        self.barrier_timeout = 3.0
        self.cdn_max_concurrent = 0
        self.rate = None

    def start(self) -> "MockHub":
        for role in ("hub", "cdn"):
            srv = _Server(("127.0.0.1", 0), _Handler)
            srv.mock, srv.role = self, role
            threading.Thread(target=srv.serve_forever, name=f"mock-{role}", daemon=True).start()
            self._servers.append(srv)
        self.endpoint = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.cdn_endpoint = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        return self

    def stop(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._servers.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- queries for tests ----

    def requests(self, server: str | None = None, method: str | None = None,
                 contains: str | None = None) -> list[dict]:
        """The log's entries, filtered: by server, method, and a substring of the decoded path."""
        with self._lock:
            log = list(self.log)
        return [e for e in log if (server is None or e["server"] == server)
                and (method is None or e["method"] == method)
                and (contains is None or contains in e["path"])]

    # ---- dispatch ----

    def _handle(self, h: _Handler, server: str, method: str) -> None:
        split = urllib.parse.urlsplit(h.path)
        auth = h.headers.get("Authorization")
        entry = {"server": server, "method": method, "path": urllib.parse.unquote(split.path),
                 "raw_path": split.path, "query": split.query, "range": h.headers.get("Range"),
                 "auth": auth is not None, "authorization": auth, "status": None, "sent": 0,
                 "time": time.time()}
        with self._lock:
            self.log.append(entry)
        inflight = False
        try:
            try:
                if method not in ("GET", "HEAD"):
                    reply = self._error(405, None, "Method not allowed")
                elif server == "hub":
                    reply = self._hub(split, auth, method)
                else:
                    reply, inflight = self._cdn(split, auth, method)
            except Exception as e:  # a bug of the mock's: say so rather than drop the connection
                reply = self._error(500, None, f"mock hub: {type(e).__name__}: {e}")
            self._send(h, server, method, reply, entry)
        finally:
            if inflight:
                with self._cond:
                    self._cdn_inflight -= 1
                    self._cond.notify_all()

    def _error(self, status: int, code: str | None, message: str, extra: dict | None = None) -> _Reply:
        headers = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        headers.update(extra or {})
        return _Reply(status, headers, json.dumps({"error": message}).encode())

    def _token(self, auth: str | None) -> tuple[str | None, _Reply | None]:
        """The request's token, or the 401 the hub gives to credentials it cannot read or know."""
        if auth is None:
            return None, None
        m = re.fullmatch(r"Bearer (\S+)", auth.strip())
        if not m or (self.valid_tokens is not None and m.group(1) not in self.valid_tokens):
            return None, self._error(401, None, "Invalid credentials in Authorization header")
        return m.group(1), None

    def _repo(self, org: str, name: str, token: str | None) -> tuple[Repo | None, _Reply | None]:
        repo = self.repos.get(f"{org}/{name}")
        if repo is None or (repo.private and token not in repo.granted):
            if token is None:
                return None, self._error(401, "RepoNotFound", "Invalid username or password.")
            return None, self._error(404, "RepoNotFound", "Repository not found")
        return repo, None

    def _hub(self, split, auth: str | None, method: str) -> _Reply:
        seg = [urllib.parse.unquote(s) for s in split.path.split("/")[1:]]
        query = urllib.parse.parse_qs(split.query)
        token, bad = self._token(auth)
        if bad:
            return bad
        if len(seg) >= 4 and seg[:2] == ["api", "models"]:
            repo, err = self._repo(seg[2], seg[3], token)
            if err:
                return err
            rest = seg[4:]
            if not rest or (rest[0] == "revision" and len(rest) >= 2):
                rev = "/".join(rest[1:]) if rest else "main"
                return self._info(repo, rev, query)
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo, rest[1], "/".join(rest[2:]).strip("/"), split, query)
            return self._error(404, None, "Not Found")
        if len(seg) >= 5 and seg[2] == "resolve":
            repo, err = self._repo(seg[0], seg[1], token)
            if err:
                return err
            return self._resolve(repo, seg[3], "/".join(seg[4:]), token)
        return self._error(404, None, "Not Found")

    def _info(self, repo: Repo, rev: str, query) -> _Reply:
        c = repo.resolve(rev)
        if c is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        blobs = query.get("blobs", ["false"])[0] == "true"
        siblings = []
        for p, e in sorted(c.files.items()):
            s = {"rfilename": p}
            if blobs:
                s.update(blobId=e.blob_id, size=e.size)
                if e.lfs:
                    s["lfs"] = {"sha256": e.sha256, "size": e.size, "pointerSize": e.pointer_size}
            siblings.append(s)
        org = repo.repo_id.split("/")[0]
        info = {"_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24], "id": repo.repo_id,
                "modelId": repo.repo_id, "author": org, "sha": c.sha, "lastModified": DATE,
                "createdAt": DATE, "private": repo.private, "disabled": False, "gated": repo.gated,
                "downloads": 0, "likes": 0, "tags": [], "library_name": "transformers",
                "siblings": siblings, "spaces": [],
                "usedStorage": sum(e.size for e in c.files.values())}
        return _Reply(200, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(info).encode())

    def _tree(self, repo: Repo, rev: str, path: str, split, query) -> _Reply:
        c = repo.resolve(rev)
        if c is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        dirs = c.directories()
        if path and path not in dirs:
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"",
                               {"X-Repo-Commit": c.sha})
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        expand = query.get("expand", ["false"])[0].lower() == "true"
        prefix = path + "/" if path else ""

        def wanted(p: str) -> bool:
            return p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])

        items = []
        for d in sorted(d for d in dirs if wanted(d)):
            items.append({"type": "directory", "oid": c.tree_oid(d), "size": 0, "path": d})
        for p, e in sorted(c.files.items()):
            if wanted(p):
                it = {"type": "file", "oid": e.blob_id, "size": e.size, "path": p}
                if e.lfs:
                    it["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": e.pointer_size}
                items.append(it)
        if expand:
            for it in items:
                it["lastCommit"] = {"id": c.sha, "title": c.message, "date": DATE}
        items.sort(key=lambda it: it["path"])
        start = 0
        if "cursor" in query:
            start = int(base64.urlsafe_b64decode(query["cursor"][0].encode()).decode().split(":")[1])
        page = items[start:start + self.page_size]
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if start + self.page_size < len(items):
            q = {k: v[0] for k, v in query.items() if k != "cursor"}
            q["cursor"] = base64.urlsafe_b64encode(f"{c.sha}:{start + self.page_size}".encode()).decode()
            headers["Link"] = f'<{self.endpoint}{split.path}?{urllib.parse.urlencode(q)}>; rel="next"'
        return _Reply(200, headers, json.dumps(page).encode())

    def _sign(self, key: str, expires: int) -> str:
        return hmac.new(self._secret, f"{key}:{expires}".encode(), hashlib.sha256).hexdigest()[:32]

    def _resolve(self, repo: Repo, rev: str, path: str, token: str | None) -> _Reply:
        if repo.gated and token not in repo.granted:
            if token is None:
                return self._error(401, "GatedRepo",
                                   f"Access to model {repo.repo_id} is restricted. You must have access to "
                                   "it and be authenticated to access it. Please log in.")
            return self._error(403, "GatedRepo",
                               f"Access to model {repo.repo_id} is restricted and you are not in the "
                               f"authorized list. Visit {self.endpoint}/{repo.repo_id} to ask for access.")
        c = repo.resolve(rev)
        if c is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        e = c.files.get(path)
        if e is None:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": c.sha})
        name = path.rsplit("/", 1)[-1]
        common = {"X-Repo-Commit": c.sha, "Vary": "Origin, Accept-Encoding",
                  "X-Request-Id": "Root=1-" + os.urandom(12).hex()}
        if e.lfs:
            expires = int(time.time()) + 3600
            key = f"{repo.repo_id}/{e.sha256}"
            query = {"name": name, "expires": expires, "sig": self._sign(key, expires)}
            loc = f"{self.cdn_endpoint}/repos/{key}?{urllib.parse.urlencode(query)}"
            body = f"Found. Redirecting to {loc}".encode()
            return _Reply(302, {**common, "Location": loc, "X-Linked-Etag": f'"{e.sha256}"',
                                "X-Linked-Size": str(e.size), "Content-Type": "text/plain; charset=utf-8",
                                "ETag": f'W/"{hashlib.sha1(body).hexdigest()[:24]}"'}, body)
        text = name.endswith((".json", ".txt", ".md", ".jinja"))
        reply = _Reply(200, {**common, "ETag": f'"{e.blob_id}"', "Accept-Ranges": "bytes",
                             "Content-Type": ("text/plain; charset=utf-8" if text
                                              else "application/octet-stream"),
                             "Content-Disposition": disposition("inline", name)})
        reply.file = (e, 0, e.size, [(repo.repo_id, path)])
        return reply

    def _cdn(self, split, auth: str | None, method: str) -> tuple[_Reply, bool]:
        m = re.fullmatch(r"/repos/([^/]+/[^/]+)/([0-9a-f]{64})", split.path)
        query = urllib.parse.parse_qs(split.query)
        if not m:
            return self._s3_error(404, "NoSuchKey", "The specified key does not exist."), False
        repo_id, sha = m.group(1), m.group(2)
        expires = query.get("expires", ["0"])[0]
        if not hmac.compare_digest(query.get("sig", [""])[0],
                                   self._sign(f"{repo_id}/{sha}", int(expires) if expires.isdigit() else 0)):
            return self._s3_error(403, "AccessDenied", "Request signature does not match"), False
        if auth is not None and self.cdn_reject_auth:
            return self._s3_error(400, "InvalidArgument",
                                  "Only one auth mechanism allowed; only the X-Amz-Algorithm query "
                                  "parameter, Signature query string parameter or the Authorization "
                                  "header should be specified"), False
        repo = self.repos.get(repo_id)
        found = [(repo_id, p, e) for c in (list(repo.commits.values()) if repo else [])
                 for p, e in c.files.items() if e.lfs and e.sha256 == sha]
        if not found:
            return self._s3_error(404, "NoSuchKey", "The specified key does not exist."), False
        e = found[0][2]
        if e.huge:
            return self._s3_error(500, "InternalError", "mock hub: a HugeFile is never served"), False
        name = query.get("name", [sha])[0]
        reply = _Reply(200, {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                             "ETag": f'"{hashlib.md5(e.data).hexdigest()}"',  # S3's, not the sha256
                             "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT",
                             "Content-Disposition": disposition("attachment", name)})
        reply.file = (e, 0, e.size, [(r, p) for r, p, _ in found])
        if method != "GET":
            return reply, False
        with self._cond:
            self._cdn_inflight += 1
            self.cdn_max_concurrent = max(self.cdn_max_concurrent, self._cdn_inflight)
            self._cond.notify_all()
            deadline = time.monotonic() + self.barrier_timeout
            while self.cdn_barrier and self._cdn_inflight < self.cdn_barrier:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        return reply, True

    def _s3_error(self, status: int, code: str, message: str) -> _Reply:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message></Error>")
        return _Reply(status, {"Content-Type": "application/xml"}, body.encode())

    # ---- sending ----

    def _take_fault(self, server: str, keys, etag: str, kinds) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.kind in kinds and f.matches(server, keys, etag):
                    return f
        return None

    def _send(self, h: _Handler, server: str, method: str, reply: _Reply, entry: dict) -> None:
        data = reply.body
        cut_at = None
        if reply.file is not None:
            e, start, end, keys = reply.file
            size = e.size
            rng = h.headers.get("Range")
            norange = self._take_fault(server, keys, e.etag, ("norange",)) if rng and method == "GET" else None
            if norange:  # answered whole, 200, as a server without Range support
                with self._lock:
                    norange.fired += 1
                entry["fault"] = "norange"
                rng = None
            if rng is not None:
                parsed = parse_range(rng, size)
                if parsed is None:
                    reply = _Reply(416, {"Content-Range": f"bytes */{size}", "Content-Type": "text/plain",
                                         **{k: v for k, v in reply.headers.items() if k.startswith("X-")}})
                elif parsed != "ignored":
                    start, end = parsed
                    reply.status = 206
                    reply.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            if reply.file is not None and method == "GET":
                fault = self._take_fault(server, keys, e.etag, ("status",))
                if fault:
                    with self._lock:
                        fault.fired += 1
                    reply = self._error(fault.status, None, f"mock hub: injected {fault.status}",
                                        {"Content-Range": f"bytes */{size}"} if fault.status == 416 else None)
                    entry["fault"] = "status"
                else:
                    data = memoryview(e.data)[start:end]
                    fault = self._take_fault(server, keys, e.etag, ("corrupt",))
                    if fault:
                        off = fault.at if fault.at is not None else size // 2
                        if start <= off < end:
                            with self._lock:
                                fault.fired += 1
                            data = bytearray(data)
                            data[off - start] ^= 0xFF
                    fault = self._take_fault(server, keys, e.etag, ("cut",))
                    if fault and end - start > 1:
                        with self._lock:
                            fault.fired += 1
                        ok = fault.at is not None and 0 < fault.at < end - start
                        cut_at = fault.at if ok else (end - start) // 2
                    entry["fault"] = fault.kind if fault else entry.get("fault")
            if reply.file is not None:
                reply.headers["Content-Length"] = str(end - start)
        if reply.file is None:
            data = reply.body
            reply.headers["Content-Length"] = str(len(reply.body))
        entry["status"] = reply.status
        h.send_response(reply.status)
        for k, v in reply.headers.items():
            h.send_header(k, v)
        h.end_headers()
        if method == "HEAD":
            return
        limit = len(data) if cut_at is None else cut_at
        view = memoryview(data)
        chunk = 1 << 16
        t0 = time.monotonic()
        sent = 0
        while sent < limit:
            n = min(chunk, limit - sent)
            h.wfile.write(view[sent:sent + n])
            sent += n
            entry["sent"] = sent
            if self.rate:
                ahead = sent / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        if cut_at is not None:
            h.wfile.flush()
            try:
                h.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            h.close_connection = True


def disposition(kind: str, name: str) -> str:
    """A Content-Disposition as the hub and its CDN send them."""
    return f"{kind}; filename*=UTF-8''{urllib.parse.quote(name)}; filename=\"{name}\";"


def parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """(start, end) of a `Range: bytes=...` header, end exclusive; "ignored" when it is not one
    range we read (a server may then send the whole file, 200); None when it asks for nothing
    inside the file (416)."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return "ignored"
    if m.group(1) == "":
        return max(0, size - int(m.group(2))), size
    start = int(m.group(1))
    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    if start >= size or end <= start:
        return None
    return start, end


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve folders as Hugging Face Hub model repos "
                                             "(ORG/FOLDER_NAME).")
    ap.add_argument("--serve", nargs="+", required=True, metavar="DIR")
    ap.add_argument("--org", default="local")
    ap.add_argument("--gated", metavar="TOKEN", help="gate every repo; TOKEN is granted")
    args = ap.parse_args()
    gate = {"gated": "manual", "granted": {args.gated}} if args.gated else {}
    repos = [Repo.from_folder(f"{args.org}/{Path(d).resolve().name}", d, **gate) for d in args.serve]
    hub = MockHub(repos).start()
    print(f"HF_ENDPOINT={hub.endpoint}  (CDN {hub.cdn_endpoint})")
    for r in repos:
        print(f"  {r.repo_id}  main={r.branches['main']}")
    sys.stdout.flush()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
