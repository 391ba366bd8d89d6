"""`lucebox up` in a real terminal (a pty): the exit code it ends with and how fast q ends it."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.models.records import files_dir
from support.hubserver import HubFile, serve_hub


class Terminal:
    """``lucebox up`` on a 100x30 pty; a reader thread keeps its output drained."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", "up", *args],
            stdin=follower,
            stdout=follower,
            stderr=follower,
            env={**env, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
            start_new_session=True,
        )
        os.close(follower)
        self.leader = leader
        self.output = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.leader, 65536)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            self.output += chunk

    def wait_for(self, text: bytes, timeout_s: float = 60) -> None:
        deadline_s = time.monotonic() + timeout_s
        while text not in self.output:
            assert self.proc.poll() is None, self.output[-2000:].decode(errors="replace")
            assert time.monotonic() < deadline_s, f"{text!r} never showed"
            time.sleep(0.05)

    def press(self, key: bytes) -> None:
        os.write(self.leader, key)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.leader)


def test_quitting_after_a_usage_error_exits_2(lucebox_home):
    terminal = Terminal(["--preset", "no-such-preset"], dict(os.environ))
    try:
        terminal.wait_for(b"no-such-preset")
        terminal.wait_for(b"Retry")
        terminal.press(b"q")
        assert terminal.proc.wait(timeout=10) == 2
    finally:
        terminal.close()


def test_q_during_a_download_ends_the_process_within_a_second(lucebox_home, tmp_path):
    body = bytes(range(256)) * (32 * 1024)  # 8 MiB at 512 KiB/s: 16 s, far longer than the test
    with serve_hub() as hub:
        hub.add("acme/big", "big-instruct.gguf", HubFile(body, bytes_per_s=512 * 1024))
        env = {**os.environ, "HF_ENDPOINT": hub.base_url, "HF_HOME": str(tmp_path / "hf")}
        partial = files_dir(resolve_paths(env)) / "acme--big" / "big-instruct.gguf.part"
        terminal = Terminal(["--model", "hf:acme/big/big-instruct.gguf"], env)
        try:
            terminal.wait_for(b"downloading")
            terminal.press(b"q")
            quit_at = time.monotonic()
            exit_code = terminal.proc.wait(timeout=10)
            ended_s = time.monotonic() - quit_at
        finally:
            terminal.close()
    assert exit_code == 0
    assert ended_s < 1.0
    assert 0 < partial.stat().st_size < len(body)


def test_up_serves_the_one_model_the_setting_names(lucebox_home):
    env = dict(os.environ)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lucebox.app.cli",
            "config",
            "set",
            "models.served",
            "no-such-model",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    terminal = Terminal([], env)
    try:
        terminal.wait_for(b"no-such-model")  # named by the setting, not the preset picker
        terminal.wait_for(b"Retry")
        terminal.press(b"q")
        assert terminal.proc.wait(timeout=10) == 2
    finally:
        terminal.close()
