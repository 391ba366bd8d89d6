"""A local HTTP server speaking the part of the Hugging Face Hub protocol that downloads use.

huggingface-hub is pointed at it with ``HF_ENDPOINT`` / ``endpoint=``. It serves
``HEAD|GET /{repo}/resolve/{revision}/{path}`` with ``X-Repo-Commit``, ``ETag``,
``X-Linked-Etag``, ``X-Linked-Size`` and Range support, and
``POST /api/models/{repo}/paths-info/{revision}`` with the LFS sha256,
``GET /api/models/{repo}[/revision/{revision}]?blobs=true`` (``HfApi.model_info(...,
files_metadata=True)``: the commit and every file with its size and LFS sha256) and
``GET /api/models?search=&filter=gguf&sort=downloads&limit=`` (``HfApi.list_models``). A repo
gains a new commit with :meth:`HubState.new_revision`; its older commits stay readable by
revision, as on the Hub. Ranges
are honoured as the Hub's storage does, open (``bytes=N-``) and closed (``bytes=N-M``), and the
body bytes sent per file are counted. With ``storage_host``
set, resolve answers as the real Hub does for LFS files: a redirect to a storage URL on another
host name (``GET /storage/{sha256}``). Faults are injected per file through real sockets: a
connection cut or reset after N bytes, a stall, an error status (5xx, 429 with Retry-After),
wrong bytes, a slow link, gated (401) and missing (404).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import parse_qs, unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass(frozen=True)
class Fault:
    """What goes wrong with one GET of a file's body."""

    kind: Literal["cut", "reset", "stall", "status"]
    after_bytes: int = 0
    """Body bytes sent before a cut, reset or stall."""
    status: int = 503
    retry_after: str | None = None
    """Retry-After header of a status answer."""
    stall_s: float = 3600.0
    """How long a stall sends nothing before closing (ended early when the server stops)."""


def cut(after_bytes: int) -> Fault:
    """Close the connection cleanly (FIN) after ``after_bytes`` of the body."""
    return Fault("cut", after_bytes)


def reset(after_bytes: int) -> Fault:
    """Abort the connection (RST) after ``after_bytes`` of the body."""
    return Fault("reset", after_bytes)


def stall(after_bytes: int, stall_s: float = 3600.0) -> Fault:
    """Send ``after_bytes`` of the body, then nothing, keeping the connection open."""
    return Fault("stall", after_bytes, stall_s=stall_s)


def status(code: int, retry_after: str | None = None) -> Fault:
    """Answer the GET with an error status instead of the body."""
    return Fault("status", status=code, retry_after=retry_after)


@dataclass
class HubFile:
    body: bytes
    served: bytes | None = None
    """Bytes actually sent, when they differ from what the sha256 promises."""
    cut_after_bytes: list[int] = field(default_factory=list)
    """Cut the connection after this many body bytes, one entry per request, in order."""
    bytes_per_s: float | None = None
    faults: list[Fault] = field(default_factory=list)
    """One fault per GET of the body, in order; later GETs are served whole."""
    sha256: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha256 = hashlib.sha256(self.body).hexdigest()


@dataclass
class HubState:
    files: dict[tuple[str, str], HubFile] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    base_url: str = ""
    storage_host: str | None = None
    """Host name (for this server) that resolve redirects file downloads to, e.g. localhost."""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Range header) of every request, in order."""
    authorized: list[tuple[str, str]] = field(default_factory=list)
    """(method, path) of the requests that carried an Authorization header."""
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set when the server stops, ending stalls early."""
    bytes_served: dict[tuple[str, str], int] = field(default_factory=dict)
    """Body bytes sent per (repo, path), every GET counted."""
    downloads: dict[str, int] = field(default_factory=dict)
    """Download counts per repo, as the search reports and sorts them."""
    heads: dict[str, str] = field(default_factory=dict)
    """Each repo's newest commit; COMMIT until the repo gains a revision."""
    history: dict[tuple[str, str], dict[str, HubFile]] = field(default_factory=dict)
    """A repo's files at each older commit: (repo, commit) -> path -> file."""

    def add(self, repo: str, path: str, hub_file: HubFile) -> HubFile:
        self.files[(repo, path)] = hub_file
        return hub_file

    def head(self, repo: str) -> str:
        return self.heads.get(repo, COMMIT)

    def new_revision(self, repo: str, commit: str, changed: dict[str, HubFile]) -> None:
        """``repo`` moves to ``commit``, where the ``changed`` paths hold new files; every
        other file stays as it was, and the old commit stays readable."""
        self.history[(repo, self.head(repo))] = self.files_at(repo, None)[1]
        for path, hub_file in changed.items():
            self.files[(repo, path)] = hub_file
        self.heads[repo] = commit

    def files_at(self, repo: str, revision: str | None) -> tuple[str, dict[str, HubFile]]:
        """The commit ``revision`` names (None or main: the head) and the repo's files there;
        an unknown revision has no files."""
        head = self.head(repo)
        if revision in (None, "main", head):
            return head, {p: f for (r, p), f in self.files.items() if r == repo}
        assert revision is not None
        return revision, self.history.get((repo, revision), {})


class _HubServer(ThreadingHTTPServer):
    """The stock server, except that a connection a reset fault ends is closed without first
    shutting its write side down: that shutdown sends a FIN ahead of the RST, and a client
    that reads the FIN first sees a clean close, not a reset."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.resetting: set[socket.socket] = set()
        """Connections to end with RST alone (each added and taken by its own thread)."""

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        if request in self.resetting:
            self.resetting.discard(request)
            self.close_request(request)
            return
        super().shutdown_request(request)


def _handler(state: HubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _lookup(self, repo: str, revision: str, path: str) -> HubFile | None:
            if repo in state.gated and "authorization" not in {k.lower() for k in self.headers}:
                self._error(401, "GatedRepo", "Access to this model is restricted.")
                return None
            if not any(r == repo for r, _ in state.files):
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            _, files = state.files_at(repo, revision)
            if not files:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return None
            hub_file = files.get(path)
            if hub_file is None:
                self._error(404, "EntryNotFound", "Entry not found")
            return hub_file

        def _resolve(self) -> None:
            state.requests.append((self.command, self.path, self.headers.get("Range")))
            if "authorization" in {k.lower() for k in self.headers}:
                state.authorized.append((self.command, self.path))
            parts = unquote(self.path.split("?")[0]).lstrip("/").split("/")
            if len(parts) == 2 and parts[0] == "storage":
                everywhere = [*state.files.values()]
                everywhere += [f for files in state.history.values() for f in files.values()]
                stored = [f for f in everywhere if f.sha256 == parts[1]]
                if not stored:
                    self._error(404, "EntryNotFound", "no such object")
                    return
                self._send_file(stored[0], {})
                return
            if len(parts) < 5 or parts[2] != "resolve":
                self._error(404, "EntryNotFound", "bad path")
                return
            repo, path = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
            hub_file = self._lookup(repo, parts[3], path)
            if hub_file is None:
                return
            hub_headers = {
                "X-Repo-Commit": state.files_at(repo, parts[3])[0],
                "ETag": f'"{hub_file.sha256}"',
                "X-Linked-Etag": f'"{hub_file.sha256}"',
                "X-Linked-Size": str(len(hub_file.body)),
            }
            if state.storage_host is not None:
                port = state.base_url.rsplit(":", 1)[1]
                self.send_response(302)
                for name, value in hub_headers.items():
                    self.send_header(name, value)
                location = f"http://{state.storage_host}:{port}/storage/{hub_file.sha256}"
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send_file(hub_file, hub_headers)

        def _send_file(self, hub_file: HubFile, extra_headers: dict[str, str]) -> None:
            fault = hub_file.faults.pop(0) if self.command == "GET" and hub_file.faults else None
            if fault is not None and fault.kind == "status":
                self._fault_status(fault)
                return
            body = memoryview(hub_file.served if hub_file.served is not None else hub_file.body)
            start, stop, status = 0, len(body), 200
            range_header = self.headers.get("Range")
            if range_header and range_header.startswith("bytes="):
                first, _, last = range_header[6:].partition("-")
                start = int(first)
                if last:
                    stop = min(int(last) + 1, len(body))
                status = 206
            if start > len(body) or stop < start:
                self._error(416, "RangeNotSatisfiable", "range")
                return
            payload = body[start:stop]
            self.send_response(status)
            for name, value in extra_headers.items():
                self.send_header(name, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(payload)))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(body)}")
            self.end_headers()
            if self.command == "HEAD":
                return
            limit = hub_file.cut_after_bytes.pop(0) if hub_file.cut_after_bytes else None
            if fault is not None:
                limit = fault.after_bytes
            to_send = payload if limit is None else payload[:limit]
            step = 64 * 1024 if hub_file.bytes_per_s else 1024 * 1024
            key = next((k for k, v in state.files.items() if v is hub_file), None)
            for offset in range(0, len(to_send), step):
                chunk = to_send[offset : offset + step]
                if key is not None:
                    # Counted before the client can have the bytes, so a test that asserts
                    # right after its read never races the server's thread.
                    state.bytes_served[key] = state.bytes_served.get(key, 0) + len(chunk)
                self.wfile.write(chunk)
                if hub_file.bytes_per_s:
                    time.sleep(step / hub_file.bytes_per_s)
            self.wfile.flush()
            if fault is not None and fault.kind == "stall":
                state.stopping.wait(fault.stall_s)
            if fault is not None and fault.kind == "reset":
                # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                assert isinstance(self.server, _HubServer)
                self.server.resetting.add(self.connection)
            if limit is not None:
                self.close_connection = True

        def _fault_status(self, fault: Fault) -> None:
            body = json.dumps({"error": f"injected {fault.status}"}).encode()
            self.send_response(fault.status)
            if fault.retry_after is not None:
                self.send_header("Retry-After", fault.retry_after)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = unquote(self.path.split("?")[0])
            if path == "/api/models":
                self._search()
            elif path.startswith("/api/models/"):
                self._model_info(path.removeprefix("/api/models/").split("/"))
            else:
                self._resolve()

        do_HEAD = _resolve

        def _json(self, value: object) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _model_info(self, parts: list[str]) -> None:
            # /api/models/{owner}/{name}[/revision/{revision}], ?blobs=true adds size and lfs.
            state.requests.append(("GET", self.path, None))
            repo = "/".join(parts[:2])
            if not any(r == repo for r, _ in state.files):
                self._error(401, "RepoNotFound", "Repository not found")
                return
            revision = parts[3] if len(parts) == 4 and parts[2] == "revision" else None
            commit, files = state.files_at(repo, revision)
            if not files:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return
            query = parse_qs(self.path.partition("?")[2])
            blobs = query.get("blobs", [""])[0].lower() == "true"
            siblings = []
            for path, hub_file in sorted(files.items()):
                entry: dict[str, object] = {"rfilename": path}
                if blobs:
                    size = len(hub_file.body)
                    entry |= {
                        "size": size,
                        "blobId": "f" * 40,
                        "lfs": {"size": size, "sha256": hub_file.sha256, "pointerSize": 134},
                    }
                siblings.append(entry)
            self._json(
                {
                    "_id": "0" * 24,
                    "id": repo,
                    "modelId": repo,
                    "sha": commit,
                    "private": False,
                    "gated": "manual" if repo in state.gated else False,
                    "disabled": False,
                    "downloads": state.downloads.get(repo, 0),
                    "likes": 0,
                    "tags": ["gguf"],
                    "library_name": "gguf",
                    "siblings": siblings,
                }
            )

        def _search(self) -> None:
            state.requests.append(("GET", self.path, None))
            query = parse_qs(self.path.partition("?")[2])
            text = query.get("search", [""])[0].lower()
            wanted = query.get("filter", [])
            limit = int(query.get("limit", ["1000"])[0])
            repos = sorted({r for r, _ in state.files})
            hits = [
                r
                for r in repos
                if text in r.lower()
                and (
                    "gguf" not in wanted
                    or any(p.endswith(".gguf") for q, p in state.files if q == r)
                )
            ]
            if query.get("sort") == ["downloads"]:
                hits.sort(key=lambda r: -state.downloads.get(r, 0))
            self._json(
                [
                    {
                        "_id": "0" * 24,
                        "id": r,
                        "modelId": r,
                        "downloads": state.downloads.get(r, 0),
                        "likes": 0,
                        "gated": "manual" if r in state.gated else False,
                        "private": False,
                        "tags": ["gguf"],
                        "lastModified": "2026-11-01T00:00:00.000Z",
                        "createdAt": "2026-10-01T00:00:00.000Z",
                    }
                    for r in hits[:limit]
                ]
            )

        def do_POST(self) -> None:
            state.requests.append(("POST", self.path, None))
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length).decode()
            parts = unquote(self.path.split("?")[0]).lstrip("/").split("/")
            # /api/models/{owner}/{name}/paths-info/{revision}
            if len(parts) < 6 or parts[:2] != ["api", "models"] or parts[4] != "paths-info":
                self._error(404, "EntryNotFound", "bad path")
                return
            repo = f"{parts[2]}/{parts[3]}"
            _, files = state.files_at(repo, parts[5])
            if self.headers.get("Content-Type", "").startswith("application/json"):
                wanted = json.loads(raw).get("paths", [])
            else:
                wanted = parse_qs(raw).get("paths", [])
            entries = []
            for path in wanted:
                hub_file = files.get(path)
                if hub_file is None:
                    continue
                size = len(hub_file.body)
                entries.append(
                    {
                        "type": "file",
                        "path": path,
                        "size": size,
                        "oid": "f" * 40,
                        "lfs": {"oid": hub_file.sha256, "size": size, "pointerSize": 134},
                    }
                )
            body = json.dumps(entries).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def serve_hub(state: HubState | None = None) -> Iterator[HubState]:
    """The local Hub, served while the context lasts. The test session keeps the real Hub out of
    reach with HF_HUB_OFFLINE (tests/conftest.py); this lifts it meanwhile (the test, and any
    lucebox it starts, reads the Hub at the HF_ENDPOINT it sets to this one's base_url)."""
    hub = state or HubState()
    server = _HubServer(_handler(hub))
    server.daemon_threads = True
    hub.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    offline = os.environ.pop("HF_HUB_OFFLINE", None)
    try:
        yield hub
    finally:
        hub.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join()
        if offline is not None:
            os.environ["HF_HUB_OFFLINE"] = offline
