"""Benchmark: what the dashboard costs. `lucebox up` runs in a pseudo-terminal (140x40) with
the smoke preset on the CPU engine, as a user's terminal would run it.

1. Dashboard CPU: CPU time of the lucebox process (TUI + sampler; the engine is a separate
   process) over --window-s seconds idle, then over --window-s seconds while requests run.
2. Decode speed with the TUI attached vs `lucebox serve` alone: median `predicted_per_second`
   of the same fixed request, in --rounds alternating rounds.

With --model, the given GGUF is served with the engine in $LUCEBOX_HOME instead
(`drive.sh tui_overhead` runs it on the GPU with a generated 8B llama).

    .venv/bin/python -m benchmarks.tui_overhead [--window-s 60] [--rounds 2] [--model PATH]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil

from benchmarks.serve_overhead import decode_speeds, serve_argv, serve_env, stop, wait_ready
from support.ports import free_port

COLUMNS, ROWS = 140, 40


class Tui:
    """`lucebox up` on a pseudo-terminal whose output is read and dropped."""

    def __init__(self, port: int, env: dict[str, str], model: Path | None) -> None:
        argv = serve_argv(port, model)
        argv[argv.index("serve")] = "up"
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe(sys.executable, argv, env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.bytes_drawn = 0
        threading.Thread(target=self._drain, daemon=True).start()
        self.process = psutil.Process(self.pid)

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.bytes_drawn += len(chunk)

    def cpu_s(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system

    def quit_stopping_the_server(self) -> None:
        os.write(self.fd, b"q")
        time.sleep(0.5)
        os.write(self.fd, b"s")
        _, status = os.waitpid(self.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"lucebox up exited with {os.waitstatus_to_exitcode(status)}")


def requests_for(port: int, window_s: float) -> list[float]:
    """Fixed requests back to back for window_s; their decode speeds."""
    speeds: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < window_s:
        speeds += decode_speeds(port, 1)
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window-s", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", type=Path, help="a GGUF to serve instead of the smoke preset")
    args = parser.parse_args()
    env = {**serve_env(args.model), "TERM": "xterm-256color"}
    result: dict[str, object] = {}
    tui_speeds: list[float] = []
    serve_speeds: list[float] = []
    for round_index in range(args.rounds):
        port = free_port()
        started = time.monotonic()
        tui = Tui(port, env, args.model)
        wait_ready(port, started)
        time.sleep(3)  # the dashboard opens once /health answers
        if round_index == 0:
            before = tui.cpu_s()
            time.sleep(args.window_s)
            result["tui_idle_cpu_percent_of_a_core"] = round(
                100 * (tui.cpu_s() - before) / args.window_s, 2
            )
        before, started = tui.cpu_s(), time.monotonic()
        tui_speeds += requests_for(port, args.window_s)
        busy_s = time.monotonic() - started
        if round_index == 0:
            result["tui_serving_cpu_percent_of_a_core"] = round(
                100 * (tui.cpu_s() - before) / busy_s, 2
            )
            result["tui_bytes_drawn"] = tui.bytes_drawn
        tui.quit_stopping_the_server()

        port = free_port()
        started = time.monotonic()
        served = subprocess.Popen(
            serve_argv(port, args.model),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_ready(port, started)
        serve_speeds += requests_for(port, args.window_s)
        stop(served)
    result.update(
        requests_each=len(tui_speeds),
        decode_tok_s_with_tui=round(statistics.median(tui_speeds), 1),
        decode_tok_s_serve_alone=round(statistics.median(serve_speeds), 1),
        decode_ratio=round(statistics.median(tui_speeds) / statistics.median(serve_speeds), 3),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
