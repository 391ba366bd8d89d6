"""A real HTTP server on loopback for download tests, with faults injected on demand."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Route:
    body: bytes
    content_type: str = "application/octet-stream"
    status: int = 200
    cut_after_bytes: int | None = None
    """Close the connection after sending this many body bytes (once, then serve whole)."""
    cuts_left: int = 1
    honours_range: bool = True
    """False: answer a Range request with the whole body (200), as some servers do."""
    stall_s: float = 0.0
    """Send the headers, then nothing for this long before the body."""


@dataclass
class FileServer:
    routes: dict[str, Route] = field(default_factory=dict)
    base_url: str = ""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Range header) of every request."""


def _handler(state: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            range_header = self.headers.get("Range")
            state.requests.append(("GET", self.path, range_header))
            route = state.routes.get(self.path.split("?")[0])
            if route is None:
                self._send(404, b'{"error": "not found"}', "application/json")
                return
            if route.status != 200:
                self._send(route.status, b'{"error": "refused"}', "application/json")
                return
            body, status, start = route.body, 200, 0
            if route.honours_range and range_header and range_header.startswith("bytes="):
                start = int(range_header[6:].split("-")[0])
                if start >= len(body):
                    self._send(416, b"", "text/plain")
                    return
                status = 206
            payload = body[start:]
            self.send_response(status)
            self.send_header("Content-Type", route.content_type)
            self.send_header("Content-Length", str(len(payload)))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.end_headers()
            if route.stall_s:
                self.wfile.flush()
                time.sleep(route.stall_s)
            if route.cut_after_bytes is not None and route.cuts_left > 0:
                route.cuts_left -= 1
                self.wfile.write(payload[: route.cut_after_bytes])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(payload)

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def serve_files(
    routes: dict[str, Route] | None = None, tls: ssl.SSLContext | None = None
) -> Iterator[FileServer]:
    """Serve ``routes`` on loopback; over HTTPS with ``tls`` (a server-side context)."""
    state = FileServer(routes=dict(routes or {}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    scheme = "http"
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    state.base_url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
