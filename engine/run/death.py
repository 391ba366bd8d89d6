"""Why an engine died, as a stable code, words a person reads and the next step (pure).

The supervisor gathers the facts at the edge (the exit status, the engine's last lines, whether
lucebox stopped it, the model file as launched and now, the host's RAM) and acts on the answer:
it restarts, re-plans, rebuilds or gives up. ``lucebox status --json`` carries the answer as
``cause`` and the crash-loop message names it.

A signal the CPU or the kernel sends (illegal instruction, SIGKILL, bus error) names the death
whatever the engine printed; an abort, a segfault or an exit is named by the engine's own last
lines when they match a known failure (the GPU out of memory, a truncated file, ...).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lucebox.engine.engines import cputarget

if TYPE_CHECKING:
    from lucebox.engine.plan.memory.sizes import MemoryBytes

LAST_LINES = 5
"""The engine's lines kept with a death: its last words before a crash."""
_LINE_CHARS = 200
_GIB = 1024**3
LOGS = "`lucebox logs`"
REPORT_STEP = f"report `lucebox doctor`'s output with the engine log ({LOGS})"


@dataclass(frozen=True)
class EngineDeath:
    """One death of the engine (or a start refused before one): what to tell a person."""

    code: str
    """Stable: illegal-instruction, killed, gpu-out-of-memory, bus-error, segfault, abort,
    not-ready, hang, engine-missing, truncated, unknown-arch, bad-flag, port-in-use,
    model-load, rpc-peer, signal-N (another signal), exit-N (an exit status)."""
    words: str
    next_step: str
    returncode: int | None = None
    """The engine's exit status (negative: the signal); None when it never started."""
    last_lines: tuple[str, ...] = ()
    retry: bool = True
    """Whether the same launch may start again: a truncated file or a refused flag fails the
    same way every time, and a changed model file is not started until it is verified."""

    @property
    def sentence(self) -> str:
        return f"{self.words}: {self.next_step}"

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "words": self.words,
            "next_step": self.next_step,
            "returncode": self.returncode,
            "last_lines": list(self.last_lines),
        }

    @classmethod
    def from_json(cls, data: Any) -> EngineDeath | None:
        if not isinstance(data, dict):
            return None
        code, words, next_step = data.get("code"), data.get("words"), data.get("next_step")
        if not (isinstance(code, str) and isinstance(words, str) and isinstance(next_step, str)):
            return None
        returncode = data.get("returncode")
        lines = data.get("last_lines")
        return cls(
            code,
            words,
            next_step,
            returncode if isinstance(returncode, int) else None,
            tuple(str(x) for x in lines) if isinstance(lines, list) else (),
        )


@dataclass(frozen=True)
class FileStamp:
    """A model file as the engine was started on it, or as it is now."""

    path: str
    size_bytes: int
    mtime_ns: int
    inode: int


def changed_file(launched: FileStamp, now: FileStamp | None) -> str | None:
    """How a model file differs from when the engine was started on it, in words; None when
    it does not."""
    if now == launched:
        return None
    if now is None:
        how = "gone"
    elif now.size_bytes != launched.size_bytes:
        how = f"{launched.size_bytes:,} -> {now.size_bytes:,} bytes"
    elif now.inode != launched.inode:
        how = "replaced by another file"
    else:
        how = "rewritten in place"
    return f"{launched.path} changed on disk since the engine started ({how})"


@dataclass(frozen=True)
class DeathFacts:
    """What the supervisor knows beyond the exit status and the lines."""

    stopped_why: str | None = None
    """Lucebox stopped the engine itself, and why (it was not ready in time)."""
    cpu_target: str | None = None
    """The CPU baseline of the build that died; None for one lucebox did not build."""
    rebuild_target: str | None = None
    """The baseline lucebox rebuilds for after an illegal instruction; None: it does not."""
    rebuilt_from: str | None = None
    """The baseline of the build that died first, when this build is lucebox's rebuild."""
    build_command: str = "lucebox engine build"
    """The command that builds this kind of engine for a baseline this CPU runs."""
    changes: tuple[str, ...] = ()
    """Each model file that changed since the engine started, in words."""
    model_name: str | None = None
    """The model's name in the store, for `lucebox models verify`."""
    host_ram_terms: str | None = None
    """What the plan holds in host RAM, in words."""
    ram_available_bytes: int | None = None
    ram_users: tuple[tuple[str, int], ...] = ()
    """The other programs holding the most RAM: name and resident bytes."""
    oom_kills_since_start: int | None = None
    """Kills by the kernel's out-of-memory killer since the engine started; None: unknown."""
    down_peers: tuple[str, ...] = ()
    """The RPC peers that do not answer after the exit."""
    hung_why: str | None = None
    """Lucebox killed the engine because a request made no progress (:mod:`hang`), and why."""


# The engine's own lines for a failure it reports before exiting (ggml-cuda.cu, llama-model.cpp,
# arg.cpp and server.cpp of the pinned source; the Lucebox engine's loader and options).
_LOG_CAUSES: list[tuple[str, str, str, str]] = [
    (
        "gpu-out-of-memory",
        # cuBLAS says "the resource allocation failed" when its handle finds no memory.
        r"out of memory|failed to allocate|unable to allocate (CUDA|Vulkan)\d* buffer"
        r"|the resource allocation failed",
        "the GPU ran out of memory",
        "pick a smaller preset or ask for less --ctx",
    ),
    (
        "truncated",
        r"data is not within the file bounds|model is corrupted or incomplete",
        "the model file is truncated or damaged",
        "run `lucebox models verify {model}` and pull it again",
    ),
    (
        "unknown-arch",
        r"unknown model architecture",
        "the engine does not know this model's architecture",
        "build a newer engine",
    ),
    (
        "bad-flag",
        r"error: invalid argument|error while handling argument|unknown argument"
        r"|\[server\] unknown option",
        "the engine refused a command-line flag",
        f"the log names it ({LOGS})",
    ),
    (
        "port-in-use",
        r"couldn't bind HTTP server socket",
        "the port is taken",
        "stop the other program or choose --port",
    ),
    (
        "model-load",
        r"exiting due to model loading error|failed to load model"
        r"|target load: |draft load: |backend creation failed",
        "the model failed to load",
        f"the log's last lines say why ({LOGS})",
    ),
]
_NO_RETRY = frozenset({"truncated", "unknown-arch", "bad-flag", "port-in-use"})

# The engine's RPC client (ggml/src/ggml-rpc/ggml-rpc.cpp of the pinned source) aborts with
# these: a peer gone while serving (RPC_STATUS_ASSERT, no address in the line) and a peer
# not answering at start (GGML_ABORT with the endpoint).
_RPC_LOST = r"Remote RPC server crashed or returned malformed response"
_RPC_UNREACHABLE = r"Failed to connect to (\S+)|RPC handshake failed for (\S+)"


def log_cause(
    lines: Sequence[str], down_peers: tuple[str, ...] = (), model_name: str | None = None
) -> EngineDeath | None:
    """The most specific known failure in the engine's last lines; None when none matches.

    ``down_peers`` are the RPC peers that did not answer after the exit: the engine's own
    line for a peer lost mid-serve does not say which one it was.
    """
    text = "\n".join(lines)
    unreachable = re.search(_RPC_UNREACHABLE, text)
    if unreachable:
        peer = unreachable.group(1) or unreachable.group(2)
        return EngineDeath(
            "rpc-peer",
            f"the RPC peer {peer} does not answer",
            "start `lucebox worker` there, or serve without it (--rpc / rpc.peers)",
        )
    if re.search(_RPC_LOST, text):
        which = ", ".join(down_peers) if down_peers else "one of the RPC peers"
        return EngineDeath(
            "rpc-peer",
            f"lost the RPC peer {which} while serving (its worker stopped or the network dropped)",
            "start `lucebox worker` there again, or serve without it",
        )
    for code, pattern, words, next_step in _LOG_CAUSES:
        if re.search(pattern, text, re.IGNORECASE):
            step = next_step.format(model=model_name or "NAME")
            return EngineDeath(code, words, step, retry=code not in _NO_RETRY)
    return None


def name_death(returncode: int, lines: Sequence[str], facts: DeathFacts) -> EngineDeath:
    """The engine's death from its exit status (negative: the signal that ended it), its last
    lines and what the supervisor knows."""
    last = last_words(lines)
    death = _named(returncode, lines, last, facts)
    death = EngineDeath(death.code, death.words, death.next_step, returncode, last, death.retry)
    if not facts.changes or death.code == "bus-error":
        return death
    return EngineDeath(
        death.code,
        f"{death.words}; {'; '.join(facts.changes)}",
        _verify_step(facts),
        returncode,
        last,
        retry=False,
    )


def _named(
    returncode: int, lines: Sequence[str], last: tuple[str, ...], facts: DeathFacts
) -> EngineDeath:
    signum = -returncode if returncode < 0 else None
    if facts.hung_why is not None:
        return EngineDeath(
            "hang",
            f"the engine hung: {facts.hung_why}; lucebox killed it and starts it again (a "
            "request it had not begun to answer goes to it again; a reply it was streaming "
            "ended with an error that says so)",
            f"the client may send its request again; if it hangs again, {REPORT_STEP}",
        )
    if signum == signal.SIGILL:
        return _illegal_instruction(facts)
    if signum == signal.SIGKILL and facts.stopped_why is None:
        return _killed(facts)
    if signum == signal.SIGBUS:
        return _bus_error(facts)
    found = log_cause(lines, facts.down_peers, facts.model_name)
    if found is not None:
        return found
    after = f", after: {last[-1]}" if last else ""
    if facts.stopped_why is not None:
        return EngineDeath(
            "not-ready",
            f"lucebox stopped the engine: {facts.stopped_why}{after}",
            f"the log's last lines say where it stopped ({LOGS})",
        )
    report = f"report it with the log's last lines ({LOGS}); another preset may avoid it"
    if signum == signal.SIGSEGV:
        return EngineDeath("segfault", f"the engine crashed (SIGSEGV){after}", report)
    if signum == signal.SIGABRT:
        return EngineDeath("abort", f"the engine aborted (SIGABRT){after}", report)
    if signum is not None:
        return EngineDeath(
            f"signal-{signum}",
            f"the engine was ended by {_signal_name(signum)}, not sent by lucebox{after}",
            "find the program that sends it; lucebox starts the engine again",
        )
    return EngineDeath(
        f"exit-{returncode}",
        f"the engine exited with status {returncode}{after}",
        f"the log's last lines say why ({LOGS})",
    )


def _illegal_instruction(facts: DeathFacts) -> EngineDeath:
    build = f"its build for {facts.cpu_target}" if facts.cpu_target else "its build"
    words = (
        f"the engine died of an illegal instruction (SIGILL): {build} uses an instruction "
        "this CPU does not run"
    )
    if facts.rebuild_target is not None:
        step = (
            f"lucebox rebuilds the same engine version for {facts.rebuild_target} once, by "
            "itself, and starts it (a few minutes)"
        )
    elif facts.rebuilt_from is not None:
        step = (
            f"lucebox rebuilt it from {facts.rebuilt_from} down to {facts.cpu_target} once and "
            f"does not again: {REPORT_STEP}"
        )
    elif facts.cpu_target in (None, cputarget.NATIVE):
        step = f"build one for a baseline this CPU runs: `{facts.build_command}`"
    elif cputarget.below(facts.cpu_target) is None:
        step = f"{facts.cpu_target} is the lowest baseline lucebox builds for: {REPORT_STEP}"
    else:
        step = REPORT_STEP
    return EngineDeath("illegal-instruction", words, step, retry=False)


def _killed(facts: DeathFacts) -> EngineDeath:
    if facts.oom_kills_since_start == 0:
        return EngineDeath(
            "killed",
            "the engine was killed (SIGKILL) by another program or a user, not by lucebox and "
            "not by the kernel's out-of-memory killer (it killed nothing since the engine started)",
            "lucebox starts it again; if something on this PC kills it on purpose (a watchdog, "
            "a script), stop that or `lucebox stop` first",
        )
    parts = []
    if facts.host_ram_terms:
        parts.append(facts.host_ram_terms)
    if facts.ram_available_bytes is not None:
        parts.append(f"{facts.ram_available_bytes / _GIB:.1f} GiB of RAM is free now")
    if facts.ram_users:
        users = ", ".join(f"{name} {size / _GIB:.1f} GiB" for name, size in facts.ram_users)
        parts.append(f"other programs hold RAM too (the most: {users})")
    parts.append("close some, or serve a smaller model or context")
    if facts.oom_kills_since_start is None:
        parts.append("`dmesg` says whether the kernel killed it")
        who = "most likely by the kernel's out-of-memory killer, for lack of host RAM"
    else:
        who = "by the kernel's out-of-memory killer, for lack of host RAM"
    return EngineDeath(
        "killed", f"the engine was killed (SIGKILL), not by lucebox: {who}", "; ".join(parts)
    )


def _bus_error(facts: DeathFacts) -> EngineDeath:
    if facts.changes:
        return EngineDeath(
            "bus-error",
            "the engine died of a bus error (SIGBUS) reading the model it maps: "
            + "; ".join(facts.changes),
            _verify_step(facts),
            retry=False,
        )
    return EngineDeath(
        "bus-error",
        "the engine died of a bus error (SIGBUS): a file it maps could not be read, though the "
        "model file is unchanged",
        "check the disk that holds the model (`dmesg` shows I/O errors)",
    )


def _verify_step(facts: DeathFacts) -> str:
    return (
        f"lucebox does not start it on a changed file: run `lucebox models verify "
        f"{facts.model_name or 'NAME'}`, or pull the model again"
    )


def _signal_name(signum: int) -> str:
    try:
        return f"{signal.Signals(signum).name} ({signum})"
    except ValueError:
        return f"signal {signum}"


def last_words(lines: Sequence[str]) -> tuple[str, ...]:
    """The engine's last non-empty lines (lucebox's own notes left out), each cut short."""
    own = [line.strip() for line in lines if line.strip() and not line.startswith("# lucebox")]
    return tuple(line[:_LINE_CHARS] for line in own[-LAST_LINES:])


def host_ram_terms(memory: MemoryBytes) -> str:
    """What a plan holds in host RAM, in words: all of it on a CPU, the prompt cache and the
    checkpoints beside a GPU."""
    if memory.prompt_cache_in_total:
        return (
            f"the plan takes {memory.total / _GIB:.1f} GiB of RAM (weights "
            f"{memory.weights / _GIB:.1f}, KV {memory.kv / _GIB:.1f}, prompt cache "
            f"{memory.prompt_cache / _GIB:.1f} GiB) of the {memory.available / _GIB:.1f} GiB "
            "it planned on"
        )
    host = memory.prompt_cache + memory.checkpoints
    return (
        f"the plan keeps {host / _GIB:.1f} GiB in host RAM beside the GPU (prompt cache and "
        "checkpoints), and the weights the GPU does not hold"
    )


def port_taken(port: int, holder: str, free_port: int | None) -> EngineDeath:
    """The engine was not started: another program holds its port; ``free_port`` is the next
    one free, offered instead (None: none near it is)."""
    instead = f"serve on port {free_port}, which is free (--port {free_port})"
    return EngineDeath(
        "port-in-use",
        f"port {port} is held by {holder}",
        f"stop that program, or {instead if free_port is not None else 'choose another --port'}",
        retry=False,
    )


def engine_missing(binary: str, why: str, build_command: str) -> EngineDeath:
    """The engine could not be started: its binary is gone or cannot run (an update or a
    cleanup removed it)."""
    return EngineDeath(
        "engine-missing",
        f"the engine binary {binary} cannot be started ({why})",
        f"build or install it again: `{build_command}`, then serve again",
        retry=False,
    )
