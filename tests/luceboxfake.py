"""A stand-in for ``dflash_server`` (the Lucebox engine needs an NVIDIA GPU) that replays what
the real engine wrote and answered on the H100 (tests/engine/fixtures/lucebox/): its start-up
lines, then per chat request the lines and the reply recorded for a 256-token greedy reply
(for a streamed request, the lines and the stream recorded for a 16-token streamed reply);
``/health`` and ``/status/json`` as recorded. It parses its command line as the engine does
(model first, space-separated options) and appends each request path to ``$FAKE_REQUESTS``.

Usage (as the engine): luceboxfake.py MODEL --port N [options...]
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent / "engine" / "fixtures" / "lucebox"
LOG = (FIXTURES / "plain.log").read_text().splitlines()
START = LOG[: next(i for i, line in enumerate(LOG) if "listening on" in line)]
REPLY_START = next(i for i, line in enumerate(LOG) if "body_bytes=109" in line)
REPLY_END = next(i for i, line in enumerate(LOG) if i > REPLY_START and "chat DONE" in line)
REPLY_LINES = LOG[REPLY_START : REPLY_END + 1]
REPLY = (FIXTURES / "plain.reply.json").read_bytes()
STREAM_START = next(i for i, line in enumerate(LOG) if "body_bytes=91" in line)
STREAM_END = next(i for i, line in enumerate(LOG) if i > STREAM_START and "chat DONE" in line)
STREAM_LINES = LOG[STREAM_START : STREAM_END + 1]
STREAM = (FIXTURES / "plain.stream.txt").read_bytes()
STATUS = (FIXTURES / "plain.status.json").read_bytes()


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _note(self) -> None:
        with open(os.environ["FAKE_REQUESTS"], "a", encoding="utf-8") as out:
            out.write(f"{self.command} {self.path}\n")

    def do_GET(self) -> None:
        self._note()
        self._send(STATUS if self.path == "/status/json" else b'{"status":"ok"}')

    def do_POST(self) -> None:
        self._note()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        streamed = bool(body.get("stream"))
        for line in STREAM_LINES if streamed else REPLY_LINES:
            say(line)
        if streamed:
            self._send(STREAM, "text/event-stream")
        else:
            self._send(REPLY)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1].startswith("-"):
        say("Usage: dflash_server <model.gguf> [options]")
        return 2
    options = argv[2:]
    for option in options:
        if option.startswith("--") and "=" in option:
            say(f"[server] unknown option: {option}")
            return 2
    with open(os.environ["FAKE_REQUESTS"], "a", encoding="utf-8") as out:
        out.write("ARGV " + json.dumps(argv[1:]) + "\n")
    port = int(options[options.index("--port") + 1])
    for line in START:
        say(line)
    server = HTTPServer(("127.0.0.1", port), Handler)
    say(f"[server] listening on http://127.0.0.1:{port}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
