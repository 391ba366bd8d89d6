"""Benchmark: each fault issue 37 names, done to a real llama-server served by `lucebox serve`.

One entry per fault (kill -9 mid-stream, SIGSTOP mid-stream, SIGILL, the model file truncated
while serving, the port taken, a full disk during the slot save, the engine binary removed):
what the client saw, what lucebox said (`status --json`'s cause, or the give-up line when the
run ended), seconds from the fault until it served again (or why it stays down), and what was
lost: the store's models, the config, the API key file are hashed before and after; the
measurements store must still parse with every entry it had; every saved slot must keep its
record and no half-written one (`.part`) may be left.

A home of its own (LUCEBOX_HOME under --work) with a copy of the built CPU engine (the entry
that removes the binary removes the copy, and puts it back) and SmolLM2 from the test cache.
The SIGSTOP entry leaves the engine stopped up to --stop-s (the issue's 2 minutes by default):
lucebox kills and restarts it at its decode hang bound (hang.DECODE_SILENCE_S). The full-disk
entry mounts a 1 MiB tmpfs over the slots folder (root only; skipped otherwise, with why).
SIGILL starts lucebox's rebuild for the baseline below; the entry stops there and reports it
(a rebuild takes many minutes on this machine).

With ``--engine lucebox`` the same entries run against the Lucebox engine on the GPU (installed in
LUCEBOX_HOME, serving ``--model`` with its Lucebox ``--draft``), plus ``gpu-oom``: a filler process
(PyTorch) takes the card's memory while a long prompt is prefilled, and lucebox re-plans.

    .venv/bin/python -m benchmarks.engine_faults [--stop-s 120] [--work DIR] [--out FILE.json]
    python3 -m benchmarks.engine_faults --engine lucebox --model T.gguf --draft D.gguf [--ctx N]
        [--only a,b] [--serve-args "--gpu 1"]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.machine.apikey import ensure_api_key_file
from lucebox.engine.models.pull import pull_model
from lucebox.engine.plan.speculation.measurements import store_file
from lucebox.engine.run.runstate import engine_log
from lucebox.engine.run.slots import PART_SUFFIX
from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import private_engine_home

READY_WAIT_S = 180.0


@dataclass
class Setup:
    """What every entry serves with; --engine lucebox sets the GPU engine's."""

    serve_args: list[str] = field(default_factory=lambda: ["--ctx", "2048", "--cache", "agent"])
    client_max_tokens: int = 100_000
    """The long reply the mid-stream entries ask for (the Lucebox engine refuses one past its
    context)."""


SETUP = Setup()
TOKENS_BEFORE_FAULT = 20
"""Streamed lines the client has received when the fault comes: it is decoding by then."""


@dataclass
class Outcome:
    fault: str
    client: str
    cause_code: str | None
    cause_words: str
    serving_again_s: float | None
    note: str
    lost: list[str] = field(default_factory=list)


class Client(threading.Thread):
    """A long streamed generation that waits as long as it takes."""

    def __init__(self, port: int, *, max_tokens: int = 100_000, prompt: str = "") -> None:
        super().__init__(daemon=True)
        self.port = port
        self.max_tokens = max_tokens
        self.prompt = prompt or "Count from one to ten thousand."
        self.lines = 0
        self.last_line = ""
        """The last non-empty line (an error event or the end, for the table)."""
        self.decoding = threading.Event()
        self.saw = "nothing yet"

    def run(self) -> None:
        body = {
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "stream": True,
            # The fault must land mid-reply: a small model may end a count early.
            "ignore_eos": True,
        }
        url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        started = time.monotonic()
        try:
            with httpx.stream("POST", url, json=body, timeout=None) as reply:
                for line in reply.iter_lines():
                    self.lines += 1
                    self.last_line = line.strip() or self.last_line
                    if self.lines == TOKENS_BEFORE_FAULT:
                        self.decoding.set()
            self.saw = (
                f"HTTP {reply.status_code}, the stream ended after {self.lines} lines, the last "
                f"{self.last_line[:160]!r}"
            )
        except httpx.HTTPError as exc:
            took = time.monotonic() - started
            self.saw = f"{type(exc).__name__} after {self.lines} lines, {took:.0f} s after it asked"
        self.decoding.set()


class Serve:
    """`lucebox serve` of a model in the bench's home, its output in a file."""

    def __init__(self, home: Path, model: str, port: int) -> None:
        self.home = home
        self.port = port
        self.output = home / f"serve-{port}.out"
        argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--model", model]
        argv += ["--port", str(port), *SETUP.serve_args]
        with self.output.open("w") as out:
            self.proc = subprocess.Popen(
                argv, env=env_of(home), stdout=out, stderr=subprocess.STDOUT
            )

    def status(self) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "lucebox.app.cli", "status", "--json"],
            env=env_of(self.home),
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            found: dict[str, Any] = json.loads(done.stdout)
        except ValueError:
            return {}
        return found

    def wait_ready(self, restarts: int = 0, wait_s: float = READY_WAIT_S) -> dict[str, Any] | None:
        """The status once it serves after ``restarts`` restarts; None when it ended first or
        the wait ran out."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            status = self.status()
            if status.get("state") == "ready" and status.get("restarts", 0) >= restarts:
                return status
            time.sleep(0.3)
        return None

    def said(self) -> str:
        """The last line lucebox printed about the server (its give-up, when it gave up)."""
        lines = [line for line in self.output.read_text().splitlines() if "server:" in line]
        return lines[-1] if lines else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def env_of(home: Path) -> dict[str, str]:
    return {**os.environ, "LUCEBOX_HOME": str(home)}


def make_home(home: Path) -> tuple[Paths, Path]:
    """The bench's home, with its own copy of the built engine; the served model's path."""
    private_engine_home(home)
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    for manifest_path in paths.engines_dir.glob("*/manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        source_bin = Path(manifest["server_path"]).parent
        target_bin = manifest_path.parent / "bin"
        if not target_bin.exists():
            shutil.copytree(source_bin, target_bin)
        manifest["server_path"] = str(target_bin / Path(manifest["server_path"]).name)
        manifest_path.write_text(json.dumps(manifest, indent=2))
    ensure_api_key_file(paths)
    record = pull_model(paths, str(smol_model()))
    return paths, record.main_path


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def kept_files(paths: Paths) -> dict[str, str]:
    """The files nothing may change: the store's models, the config, the API key file."""
    folders = (paths.config_dir, paths.data_dir / "models")
    return {
        str(p): _hash(p)
        for folder in folders
        if folder.exists()
        for p in folder.rglob("*")
        if p.is_file()
    }


def stores(paths: Paths) -> tuple[set[str], set[str]]:
    """The measurements store's entries and the saved slots (each with its record)."""
    store = store_file(paths)
    entries = set(json.loads(store.read_text())) if store.exists() else set()
    slots = {p.name for p in paths.slots_dir.glob("*.slot")} if paths.slots_dir.exists() else set()
    return entries, slots


def lost_since(
    paths: Paths, files: dict[str, str], entries: set[str], slots: set[str]
) -> list[str]:
    lost = [
        f"{path} changed or gone"
        for path, digest in files.items()
        if not Path(path).exists() or _hash(Path(path)) != digest
    ]
    try:
        now_entries, now_slots = stores(paths)
    except ValueError as exc:
        return [*lost, f"the measurements store does not parse: {exc}"]
    lost += [f"measurement {name} gone" for name in entries - now_entries]
    lost += [f"slot {name} gone" for name in slots - now_slots]
    if paths.slots_dir.exists():
        lost += [f"half-written {p.name} left" for p in paths.slots_dir.glob(f"*{PART_SUFFIX}")]
        lost += [
            f"slot {p.name} without its record"
            for p in paths.slots_dir.glob("*.slot")
            if not p.with_name(p.name + ".json").exists()
        ]
    return lost


def cause_of(status: dict[str, Any] | None) -> tuple[str | None, str]:
    cause = (status or {}).get("cause") or {}
    return cause.get("code"), f"{cause.get('words', '')}: {cause.get('next_step', '')}"


def mid_stream(paths: Paths, model: Path, signum: int, stop_s: float) -> Outcome:
    """A signal to the engine while a client streams a long reply."""
    serve = Serve(paths.config_dir.parent, str(model), free_port())
    try:
        ready = serve.wait_ready()
        assert ready is not None, serve.output.read_text()
        client = Client(serve.port, max_tokens=SETUP.client_max_tokens)
        client.start()
        client.decoding.wait(60)
        os.kill(int(ready["engine_pid"]), signum)
        hit = time.monotonic()
        again = serve.wait_ready(restarts=1, wait_s=stop_s + 30)
        back_s = time.monotonic() - hit if again is not None else None
        if signum == signal.SIGSTOP and again is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(ready["engine_pid"]), signal.SIGCONT)
        client.join(30)
        code, words = cause_of(again)
        return Outcome(
            signal.Signals(signum).name,
            client.saw,
            code,
            words,
            back_s,
            "restarted by lucebox" if again else f"not serving again within {stop_s + 30:.0f} s",
        )
    finally:
        serve.stop()


def sigill(paths: Paths, model: Path) -> Outcome:
    """SIGILL: lucebox starts a rebuild for the baseline below; the entry stops there."""
    serve = Serve(paths.config_dir.parent, str(model), free_port())
    try:
        ready = serve.wait_ready()
        assert ready is not None, serve.output.read_text()
        os.kill(int(ready["engine_pid"]), signal.SIGILL)
        hit = time.monotonic()
        status: dict[str, Any] = {}
        while time.monotonic() - hit < 30 and "rebuilding" not in engine_log(paths).read_text():
            time.sleep(0.3)
        status = serve.status()
        code, words = cause_of(status)
        rebuilding = [
            line
            for line in engine_log(paths).read_text().splitlines()
            if "rebuilding the same engine version" in line
        ]
        note = (
            f"{rebuilding[-1].split('restarting: ', 1)[-1]}; started "
            f"{time.monotonic() - hit:.1f} s after the signal, not waited for"
            if rebuilding
            else "no rebuild started"
        )
        return Outcome("SIGILL", "no request was running", code, words, None, note)
    finally:
        serve.stop()


def truncated(paths: Paths, model: Path, work: Path) -> Outcome:
    """The served model file cut to a quarter while it serves, then a request."""
    copy = work / "truncate-me.gguf"
    shutil.copy(model, copy)
    serve = Serve(paths.config_dir.parent, str(copy), free_port())
    try:
        assert serve.wait_ready() is not None, serve.output.read_text()
        with copy.open("r+b") as handle:
            handle.truncate(copy.stat().st_size // 4)
        body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
        try:
            reply = httpx.post(
                f"http://127.0.0.1:{serve.port}/v1/chat/completions", json=body, timeout=60
            )
            saw = f"HTTP {reply.status_code}"
        except httpx.HTTPError as exc:
            saw = type(exc).__name__
        note = "stays down on purpose until `lucebox models verify`"
        try:
            serve.proc.wait(60)
        except subprocess.TimeoutExpired:
            # An engine that holds the weights in GPU memory (the Lucebox engine) reads the
            # file again only when it starts: kill it, and see what the start after it says.
            engine_pid = serve.status().get("engine_pid")
            if isinstance(engine_pid, int):
                os.kill(engine_pid, signal.SIGKILL)
            try:
                serve.proc.wait(150)
                note = "served on from GPU memory; after the engine died, " + note
            except subprocess.TimeoutExpired:
                status = serve.status()
                note = (
                    f"served on from GPU memory; 150 s after the engine was killed: "
                    f"{status.get('state')}, {status.get('restarts')} restarts"
                )
        said = serve.said()
        status = serve.status()
        code, words = cause_of(status) if status.get("cause") else (None, said)
        if code is None and "bus error" in said:
            code = "bus-error"
        return Outcome("truncated", saw, code, words or said, None, note)
    finally:
        serve.stop()


def port_taken(paths: Paths, model: Path) -> Outcome:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        serve = Serve(paths.config_dir.parent, str(model), port)
        serve.proc.wait(120)
    said = serve.said()
    starts = engine_log(paths).read_text().count(f"--port {port}")
    return Outcome(
        "port-taken",
        "no server to ask",
        "port-in-use" if "is held by" in said else None,
        said,
        None,
        f"exit {serve.proc.returncode}; engine starts on the port: {starts}",
    )


def full_disk(paths: Paths, model: Path, work: Path) -> Outcome:
    """The slot saved on stop into a 1 MiB tmpfs: the save fails for space."""
    aside = work / "slots-aside"
    paths.slots_dir.mkdir(parents=True, exist_ok=True)
    shutil.move(str(paths.slots_dir), aside)
    paths.slots_dir.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(paths.slots_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        paths.slots_dir.rmdir()
        shutil.move(str(aside), paths.slots_dir)
        return Outcome(
            "full-disk",
            "-",
            None,
            "",
            None,
            f"skipped: a tmpfs cannot be mounted here ({mount.stderr.strip()})",
        )
    try:
        serve = Serve(paths.config_dir.parent, str(model), free_port())
        assert serve.wait_ready() is not None, serve.output.read_text()
        body = {"messages": [{"role": "user", "content": "Say hello. " * 200}], "max_tokens": 8}
        reply = httpx.post(
            f"http://127.0.0.1:{serve.port}/v1/chat/completions", json=body, timeout=120
        )
        serve.stop()
        left = sorted(p.name for p in paths.slots_dir.iterdir())
        saved = "slot saved" in "\n".join(engine_log(paths).read_text().splitlines()[-5:])
        return Outcome(
            "full-disk",
            f"HTTP {reply.status_code} (the save is on the stop)",
            None,
            "",
            None,
            f"stop exit {serve.proc.returncode}; slot saved: {saved}; "
            f"left in the full folder: {left or 'nothing'}",
        )
    finally:
        subprocess.run(["umount", str(paths.slots_dir)], check=False)
        paths.slots_dir.rmdir()
        shutil.move(str(aside), paths.slots_dir)


def binary_removed(paths: Paths, model: Path) -> Outcome:
    """The engine binary renamed away while it serves, then the engine killed."""
    serve = Serve(paths.config_dir.parent, str(model), free_port())
    binary: Path | None = None
    try:
        ready = serve.wait_ready()
        assert ready is not None, serve.output.read_text()
        binary = Path(psutil_exe(int(ready["engine_pid"])))
        binary.rename(binary.with_name(binary.name + ".away"))
        client = Client(serve.port, max_tokens=SETUP.client_max_tokens)
        client.start()
        client.decoding.wait(60)
        os.kill(int(ready["engine_pid"]), signal.SIGKILL)
        serve.proc.wait(60)
        client.join(30)
        said = serve.said()
        code = "engine-missing" if "cannot be started" in said else None
        return Outcome(
            "binary-removed",
            client.saw,
            code,
            said,
            None,
            "stays down on purpose until the engine is built again",
        )
    finally:
        serve.stop()
        if binary is not None:
            binary.with_name(binary.name + ".away").rename(binary)


FILLER = """
import sys, time, torch
leave = int(sys.argv[1]) << 20
held = []
while True:
    free, _ = torch.cuda.mem_get_info(0)
    if free <= leave + (64 << 20):
        break
    size = min(free - leave, 1 << 30)
    held.append(torch.empty(size, dtype=torch.uint8, device="cuda:0"))
print("held", sum(t.numel() for t in held) >> 20, "MiB", flush=True)
time.sleep(float(sys.argv[2]))
"""


def gpu_oom(paths: Paths, model: Path, prompt_words: int, leave_mib: int) -> Outcome:
    """A filler process takes all but ``leave_mib`` of GPU 0's free memory while the engine
    serves; then a long prompt comes (the Lucebox engine allocates its rollback buffers and
    prefill scratch on a request, not at load): the engine's out-of-memory death, lucebox's
    re-plan for the memory the engine's exit leaves, serving again beside the filler."""
    serve = Serve(paths.config_dir.parent, str(model), free_port())
    filler: subprocess.Popen[str] | None = None
    try:
        ready = serve.wait_ready()
        assert ready is not None, serve.output.read_text()
        filler = subprocess.Popen(
            [sys.executable, "-c", FILLER, str(leave_mib), "600"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert filler.stdout is not None
        held = filler.stdout.readline().strip()
        # "hello" is about one token in both the real and the generated vocabularies ("word"
        # is five in the generated one: its prompt ran past the context and was refused).
        client = Client(serve.port, max_tokens=64, prompt="hello " * prompt_words)
        client.start()
        hit = time.monotonic()
        again = serve.wait_ready(restarts=1, wait_s=150)
        back_s = time.monotonic() - hit if again is not None else None
        client.join(60)
        code, words = cause_of(again or serve.status())
        now = serve.status()
        survived = (
            now.get("state") == "ready"
            and now.get("engine_pid") == ready.get("engine_pid")
            and now.get("restarts", 0) == 0
        )
        if again:
            note = f"the filler {held}; re-planned ctx {again.get('ctx')} (was {ready.get('ctx')})"
        elif survived:
            note = f"the filler {held}; the engine survived it (same process, serving)"
        else:
            note = f"the filler {held}; not serving again within 150 s: {serve.said()}"
        return Outcome("gpu-oom", client.saw, code, words, back_s, note)
    finally:
        if filler is not None:
            filler.kill()
            filler.wait()
        serve.stop()


def psutil_exe(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stop-s",
        type=float,
        default=120.0,
        help="how long the SIGSTOP entry leaves the engine stopped at most",
    )
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/cpu-engine-faults.json")
    )
    parser.add_argument(
        "--engine",
        choices=("llama-server", "lucebox"),
        default="llama-server",
        help="lucebox: the Lucebox engine on the GPU, installed in LUCEBOX_HOME (--model and "
        "--draft needed); llama-server: the test suite's CPU build with SmolLM2",
    )
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--ctx", type=int, default=65536, help="the Lucebox engine's context")
    parser.add_argument("--only", default="", help="comma-separated entries to run")
    parser.add_argument(
        "--serve-args",
        default="",
        help="more arguments for lucebox serve (--gpu 1: the second card, beside another run)",
    )
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="lucebox-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.engine == "lucebox":
        if args.model is None or args.draft is None:
            parser.error("--engine lucebox needs --model and --draft")
        paths = resolve_paths(dict(os.environ))
        ensure_api_key_file(paths)
        model = args.model.resolve()
        SETUP.serve_args = ["--engine", "lucebox", "--draft", str(args.draft.resolve())]
        SETUP.serve_args += ["--ctx", str(args.ctx), "--cache", "agent"]
        SETUP.client_max_tokens = args.ctx // 2
    else:
        paths, model = make_home(work / "home")
    SETUP.serve_args += args.serve_args.split()
    entries: list[tuple[str, Callable[[], Outcome]]] = [
        ("kill-9", lambda: mid_stream(paths, model, signal.SIGKILL, args.stop_s)),
        ("sigstop", lambda: mid_stream(paths, model, signal.SIGSTOP, args.stop_s)),
        ("sigill", lambda: sigill(paths, model)),
        ("truncated", lambda: truncated(paths, model, work)),
        ("port-taken", lambda: port_taken(paths, model)),
        ("full-disk", lambda: full_disk(paths, model, work)),
        ("binary-removed", lambda: binary_removed(paths, model)),
    ]
    if args.engine == "lucebox":
        words = args.ctx // 2
        entries.insert(2, ("gpu-oom", lambda: gpu_oom(paths, model, words, 512)))
    if args.only:
        wanted = args.only.split(",")
        entries = [entry for entry in entries if entry[0] in wanted]
    outcomes = []
    for name, entry in entries:
        files, (measured, slots) = kept_files(paths), stores(paths)
        print(f"# {name}", flush=True)
        try:
            outcome = entry()
        except Exception as exc:  # one entry's failure leaves the others to run
            outcome = Outcome(name, f"the bench failed: {type(exc).__name__}: {exc}", None, "",
                              None, "not measured")  # fmt: skip
        outcome.lost = lost_since(paths, files, measured, slots)
        outcomes.append(outcome)
        print(list(table([outcome]))[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "engine": "llama-server (CPU)" if args.engine == "llama-server" else "lucebox (GPU)",
        "model": model.name,
        "serve_args": SETUP.serve_args,
        "stop_s": args.stop_s,
        "faults": [asdict(o) for o in outcomes],
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    for row in table(outcomes):
        print(row)
    return 0


def table(outcomes: list[Outcome]) -> Iterator[str]:
    yield "| fault | client saw | cause | serving again | lost | note |"
    yield "|---|---|---|---|---|---|"
    for o in outcomes:
        back = f"{o.serving_again_s:.1f} s" if o.serving_again_s is not None else "-"
        yield (
            f"| {o.fault} | {o.client} | {o.cause_code or '-'} | {back} | "
            f"{'; '.join(o.lost) or 'nothing'} | {o.note} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
