"""A stand-in for ``dflash_server`` (the Lucebox engine needs an NVIDIA GPU) that replays what
the real engine wrote and answered on the H100 (tests/engine/fixtures/lucebox/): its start-up
lines, then per chat request the lines and the reply recorded for a 256-token greedy reply
(for a streamed request, the lines and the stream recorded for a 16-token streamed reply);
``/health`` and ``/status/json`` as recorded. Started with ``--draft``, a chat request logs the
lines the real engine wrote on an H200 for a DDTree reply with an agreeing draft
(``ddtree-agree.log``: 45 of 48 drafted tokens accepted). It parses its command line as the
engine does (model first, space-separated options) and appends each request path to
``$FAKE_REQUESTS`` (and each POST body, one JSON line each, to ``$FAKE_BODIES`` where set).
Streams are framed as the engine frames them: by closing the connection. Started with both
``--max-ctx`` and ``--max-tokens`` (as lucebox starts it), a request is admitted as the engine
admits it: its reply limit clamped to ``--max-tokens``, and a prompt (one token
per four characters) with that limit over ``--max-ctx`` refused 400 with the engine's message.

With ``$FAKE_RATES`` naming a JSON file ``{"decode_tok_s": D, "prefill_tok_s": P}`` (read at
each request, so a test may change it while the engine runs), a non-streamed reply has
``max_tokens`` tokens and its numbers are those rates instead: the usage the engine returns,
and the ``[ar-decode]`` and ``chat DONE`` lines it logs, in the recorded shapes the real code
reads (tests/e2e/test_enginecalibration.py reads them back with the real parsers). A
prompt counts one token per four characters. Its ``"modes"`` may give other rates per
long-context mode the engine was started in (``"exact q8_0"``, ``"kvflash q4_0"``: ``--kvflash``
and ``--cache-type-k`` on its command line), ``"long_drop"`` the share of decode speed lost
by a 64K-token prompt (the exact cache's attention grows with it; a KVFlash pool's does not)
``"sleep_s"`` how long each reply takes (each reply logs the mode that answered it), and
``"start_exit"`` an exit status the engine ends with at start in that mode, after the line the
real engine prints when a buffer does not fit.

Usage (as the engine): luceboxfake.py MODEL --port N [options...]
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

if __package__:
    from support import luceboxdisk
else:  # run as the engine's binary: a script beside its module
    import luceboxdisk  # type: ignore[no-redef, import-not-found]

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "engine" / "fixtures" / "lucebox"
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
DRAFT_REPLY_LINES = (FIXTURES / "ddtree-agree.log").read_text().splitlines()
DRAFTING = [False]
DISK = [luceboxdisk.DiskCache()]
"""The disk prefix cache it was started with (support/luceboxdisk.py)."""
MODE = ["exact f16"]
LIMITS: dict[str, int] = {}
"""``--max-ctx`` and ``--max-tokens`` as started; without both (a test starting the stand-in by
hand) every request is admitted."""
"""The long-context mode the engine runs: its rates in ``$FAKE_RATES``' ``"modes"``."""


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, body: bytes, content_type: str = "application/json", status: int = 200) -> None:
        self.send_response(status)
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
        if os.environ.get("FAKE_BODIES"):
            with open(os.environ["FAKE_BODIES"], "a", encoding="utf-8") as out:
                out.write(json.dumps(body) + "\n")
        if refusal := overflow(body):
            self._send(refusal, status=400)
            return
        streamed = bool(body.get("stream"))
        disk = DISK[0]
        if disk.on:
            disk.chat([str(m.get("content", "")) for m in body.get("messages", [])], "chatcmpl")
        rates = os.environ.get("FAKE_RATES")
        if rates and not streamed:
            self._send(rated_reply(body, json.loads(Path(rates).read_text())))
            return
        lines = STREAM_LINES if streamed else REPLY_LINES
        for line in DRAFT_REPLY_LINES if DRAFTING[0] else lines:
            if not (disk.on and " chat CACHE " in line):
                say(line)
        if streamed:
            self._stream()
        else:
            self._send(REPLY)

    def _stream(self) -> None:
        """SSE as the engine sends it (``send_sse_headers`` in 4cf58a04's http_server.cpp:
        ``Connection: keep-alive``, unlike its other answers): no length, not chunked, the
        stream ends when the connection closes. With ``$FAKE_STREAM_CUT`` the engine dies
        after the first half of the stream's events."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "keep-alive")
        self.end_headers()
        self.close_connection = True
        if os.environ.get("FAKE_STREAM_CUT"):
            events = STREAM.split(b"\n\n")
            self.wfile.write(b"\n\n".join(events[: len(events) // 2]) + b"\n\n")
            self.wfile.flush()
            os._exit(1)
        self.wfile.write(STREAM)


_REPLIES = [0]


def prompt_tokens(body: dict) -> int:
    """One token per four characters of the messages' text."""
    text = "".join(str(m.get("content", "")) for m in body.get("messages", []))
    return max(1, len(text) // 4)


def overflow(body: dict) -> bytes | None:
    """The engine's admission (http_server.cpp, admission.h): the reply limit clamped to
    ``--max-tokens``, then a prompt and limit over ``--max-ctx`` refused with its message."""
    if len(LIMITS) < 2:
        return None
    asked = [
        body[k] for k in ("max_tokens", "max_output_tokens", "max_completion_tokens") if k in body
    ]
    max_output = int(asked[0]) if asked else LIMITS["max_tokens"]
    if max_output > LIMITS["max_tokens"]:
        say(
            f"[server] max_tokens={max_output} clamped to default_max_tokens={LIMITS['max_tokens']}"
        )
        max_output = LIMITS["max_tokens"]
    prompt = prompt_tokens(body)
    if prompt + max_output <= LIMITS["max_ctx"]:
        return None
    message = (
        f"This model's maximum context length is {LIMITS['max_ctx']} tokens. However, you "
        f"requested {prompt + max_output} tokens ({prompt} in the messages, {max_output} in the "
        "completion). Please reduce the length of the messages or completion."
    )
    return json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()


def rated_reply(body: dict, rates: dict) -> bytes:
    """The recorded reply cut to ``max_tokens`` tokens, timed at ``rates``; logs its lines."""
    _REPLIES[0] += 1
    reply_id = f"chatcmpl_{_REPLIES[0]:016d}"
    text = "".join(str(m.get("content", "")) for m in body.get("messages", []))
    prompt = prompt_tokens(body)
    words = json.loads(REPLY)["choices"][0]["message"]["content"].split()
    out = int(body.get("max_tokens") or 256)
    rates = rates.get("modes", {}).get(MODE[0], rates)
    say(f"[fake] {MODE[0]} answers: {text[:32]}")
    time.sleep(float(rates.get("sleep_s", 0.0)))
    decode_tok_s = float(rates["decode_tok_s"]) * (
        1 - float(rates.get("long_drop", 0.0)) * min(prompt, 65536) / 65536
    )
    decode_s = out / decode_tok_s
    prefill_s = prompt / float(rates["prefill_tok_s"])
    tok_s = out / decode_s
    say(f"[ar-decode] tokens={out} time={decode_s:.3f} s speed={tok_s:.2f} tok/s")
    say(
        f"[server] chat DONE {reply_id} ok=true in={prompt} effective_in={prompt} out={out} "
        f"{prefill_s + decode_s:.1f}s {out / (prefill_s + decode_s):.1f} tok/s finish=length "
        f"restore=false slot=-1 prefix_len=0 prefill={prefill_s:.3f}s "
        f"decode={decode_s:.3f}s({tok_s:.1f}tok/s) error=- detail=-"
    )
    reply = json.loads(REPLY)
    reply["id"] = reply_id
    reply["choices"][0]["message"]["content"] = " " + " ".join((words * 8)[:out])
    reply["usage"] = {
        "accept_rate": 0.0,
        "completion_tokens": out,
        "completion_tokens_details": {"reasoning_tokens": 0},
        "prompt_tokens": prompt,
        "timings": {
            "decode_ms": round(decode_s * 1000, 3),
            "decode_tokens_per_sec": round(tok_s, 1),
            "prefill_ms": round(prefill_s * 1000, 3),
        },
        "total_tokens": prompt + out,
    }
    return json.dumps(reply).encode()


def _stop(signum: int, frame: object) -> None:
    """SIGTERM: the engine's accept loop ends and its disk cache saves the tracked prompt."""
    DISK[0].shutdown()
    os._exit(0)


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
    DRAFTING[0] = "--draft" in options
    for limit in ("max_ctx", "max_tokens"):
        flag = "--" + limit.replace("_", "-")
        if flag in options:
            LIMITS[limit] = int(options[options.index(flag) + 1])
    kv_type = options[options.index("--cache-type-k") + 1] if "--cache-type-k" in options else "f16"
    MODE[0] = f"{'kvflash' if '--kvflash' in options else 'exact'} {kv_type}"
    rates = os.environ.get("FAKE_RATES")
    mode = json.loads(Path(rates).read_text()).get("modes", {}).get(MODE[0], {}) if rates else {}
    if "start_exit" in mode:  # the ggml line of the engine contract (ggml-cuda.cu:928)
        say("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2048.00 MiB on device 0: "
            "cudaMalloc failed: out of memory")  # fmt: skip
        return int(mode["start_exit"])
    disk = luceboxdisk.configure(options)
    if isinstance(disk, int):
        return disk
    for line in START:
        say(line)
    if disk.on:
        max_ctx = int(options[options.index("--max-ctx") + 1]) if "--max-ctx" in options else 8192
        disk.start(argv[1], max_ctx, f"{kv_type}/{kv_type}")
    DISK[0] = disk
    signal.signal(signal.SIGTERM, _stop)
    server = HTTPServer(("127.0.0.1", port), Handler)
    say(f"[server] listening on http://127.0.0.1:{port}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
