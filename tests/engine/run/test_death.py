"""Every death of the engine named: a stable code, the words and the next step (pure)."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from lucebox.engine.run.death import (
    DeathFacts,
    EngineDeath,
    FileStamp,
    changed_file,
    host_ram_terms,
    name_death,
)

LOAD_LINES = [
    "load_tensors: loading model tensors, this can take a while... (mmap = true)",
    "srv  load_model: initializing slots, n_slots = 1",
]
CUDA_OOM = (
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: "
    "cudaMalloc failed: out of memory"
)
MODEL = FileStamp("/m/smol.gguf", 98_362_432, 1_700_000_000_000_000_000, 42)


def test_an_illegal_instruction_is_rebuilt_for_the_baseline_below_once():
    facts = DeathFacts(cpu_target="x86-64-v3", rebuild_target="x86-64-v2")
    death = name_death(-signal.SIGILL, LOAD_LINES, facts)
    assert death.code == "illegal-instruction" and not death.retry
    assert "x86-64-v3" in death.words and "this CPU does not run" in death.words
    assert "rebuilds the same engine version for x86-64-v2 once" in death.next_step
    again = name_death(
        -signal.SIGILL, LOAD_LINES, DeathFacts(cpu_target="x86-64-v2", rebuilt_from="x86-64-v3")
    )
    assert "does not again" in again.next_step and "lucebox doctor" in again.next_step
    floor = name_death(-signal.SIGILL, [], DeathFacts(cpu_target="x86-64-v2"))
    assert "lowest baseline" in floor.next_step
    foreign = name_death(-signal.SIGILL, [], DeathFacts())
    assert "build one for a baseline this CPU runs: `lucebox engine build`" in foreign.next_step
    native = DeathFacts(cpu_target="native", build_command="lucebox engine build --engine lucebox")
    assert "`lucebox engine build --engine lucebox`" in name_death(-4, [], native).next_step


def test_a_sigkill_lucebox_did_not_send_is_the_kernel_out_of_memory_killer():
    facts = DeathFacts(
        host_ram_terms="the plan takes 1.2 GiB of RAM",
        ram_available_bytes=512 * 1024**2,
        ram_users=(("firefox", 3 * 1024**3), ("java", 2 * 1024**3)),
        oom_kills_since_start=1,
    )
    death = name_death(-signal.SIGKILL, LOAD_LINES, facts)
    assert death.code == "killed" and death.retry
    assert "not by lucebox: by the kernel's out-of-memory killer" in death.words
    assert "host RAM" in death.words and "dmesg" not in death.next_step
    assert "the plan takes 1.2 GiB of RAM" in death.next_step
    assert "0.5 GiB of RAM is free now" in death.next_step
    assert "firefox 3.0 GiB, java 2.0 GiB" in death.next_step
    # Where the kernel keeps no count, the reading says what is likely and where to look.
    unknown = name_death(-signal.SIGKILL, LOAD_LINES, replace(facts, oom_kills_since_start=None))
    assert "most likely by the kernel's out-of-memory killer" in unknown.words
    assert "`dmesg` says whether the kernel killed it" in unknown.next_step
    # No kill by the out-of-memory killer since the start: a user's or a program's kill -9.
    by_hand = name_death(-signal.SIGKILL, LOAD_LINES, replace(facts, oom_kills_since_start=0))
    assert by_hand.code == "killed" and by_hand.retry
    assert "by another program or a user" in by_hand.words and "RAM" not in by_hand.next_step
    # The same signal sent by lucebox (an engine not ready in time) is no kernel's doing.
    stopped = name_death(-signal.SIGKILL, LOAD_LINES, DeathFacts(stopped_why="not ready"))
    assert stopped.code == "not-ready" and "lucebox stopped the engine: not ready" in stopped.words


def test_a_bus_error_on_a_changed_model_file_refuses_a_restart_until_verified():
    truncated = FileStamp(MODEL.path, 1024, MODEL.mtime_ns + 1, MODEL.inode)
    change = changed_file(MODEL, truncated)
    assert (
        change
        == f"{MODEL.path} changed on disk since the engine started (98,362,432 -> 1,024 bytes)"
    )
    facts = DeathFacts(changes=(change,), model_name="smol")
    death = name_death(-signal.SIGBUS, LOAD_LINES, facts)
    assert death.code == "bus-error" and not death.retry
    assert change in death.words
    assert "`lucebox models verify smol`" in death.next_step
    unchanged = name_death(-signal.SIGBUS, LOAD_LINES, DeathFacts())
    assert unchanged.retry and "unchanged" in unchanged.words
    # Any death on a changed file says so and waits for the verify.
    segfault = name_death(-signal.SIGSEGV, LOAD_LINES, facts)
    assert segfault.code == "segfault" and not segfault.retry and change in segfault.words


@pytest.mark.parametrize(
    ("now", "how"),
    [
        (MODEL, None),
        (None, "gone"),
        (FileStamp(MODEL.path, MODEL.size_bytes, MODEL.mtime_ns, 7), "replaced by another file"),
        (FileStamp(MODEL.path, MODEL.size_bytes, 1, MODEL.inode), "rewritten in place"),
    ],
)
def test_a_model_file_change_is_told_apart(now, how):
    change = changed_file(MODEL, now)
    assert (change is None) if how is None else (change is not None and how in change)


def test_segfault_and_abort_carry_the_last_engine_lines():
    lines = [*LOAD_LINES, "# lucebox: warm-up answered", "", "ggml.c:1234: GGML_ASSERT(x) failed"]
    aborted = name_death(-signal.SIGABRT, lines, DeathFacts())
    assert aborted.code == "abort" and "after: ggml.c:1234: GGML_ASSERT(x) failed" in aborted.words
    assert aborted.last_lines == (*LOAD_LINES, "ggml.c:1234: GGML_ASSERT(x) failed")
    crashed = name_death(-signal.SIGSEGV, LOAD_LINES, DeathFacts())
    assert crashed.code == "segfault" and crashed.last_lines[-1] == LOAD_LINES[-1]
    assert "lucebox logs" in crashed.next_step


def test_the_engines_own_line_names_an_abort_or_an_exit():
    # The Lucebox engine aborts after a failed CUDA allocation; llama-server exits 1.
    assert name_death(-signal.SIGABRT, [CUDA_OOM], DeathFacts()).code == "gpu-out-of-memory"
    assert name_death(1, [CUDA_OOM], DeathFacts()).code == "gpu-out-of-memory"
    # A signal from the CPU or the kernel names the death whatever the engine printed.
    assert name_death(-signal.SIGILL, [CUDA_OOM], DeathFacts()).code == "illegal-instruction"


def test_other_exits_and_signals_keep_their_number():
    exited = name_death(3, ["main: something odd"], DeathFacts())
    assert exited.code == "exit-3" and "status 3" in exited.words and exited.retry
    assert "after: main: something odd" in exited.words
    ended = name_death(-signal.SIGTERM, [], DeathFacts())
    assert ended.code == f"signal-{int(signal.SIGTERM)}" and "SIGTERM" in ended.words


def test_the_cause_round_trips_through_the_state_file():
    death = name_death(-signal.SIGSEGV, LOAD_LINES, DeathFacts())
    document = death.to_json()
    assert set(document) == {"code", "words", "next_step", "returncode", "last_lines"}
    back = EngineDeath.from_json(document)
    assert back is not None
    assert (back.code, back.words, back.next_step, back.last_lines) == (
        death.code,
        death.words,
        death.next_step,
        death.last_lines,
    )
    assert EngineDeath.from_json({"code": 1}) is None


def test_the_host_ram_a_plan_holds_on_a_cpu_and_beside_a_gpu():
    from lucebox.engine.plan.memory.sizes import MemoryBytes

    gib = 1024**3
    on_cpu = MemoryBytes(2 * gib, gib, 0, gib // 2, 0, 0, 12 * gib, gib // 2, 0, True)
    assert host_ram_terms(on_cpu) == (
        "the plan takes 4.0 GiB of RAM (weights 2.0, KV 1.0, prompt cache 0.5 GiB) of the "
        "12.0 GiB it planned on"
    )
    beside_gpu = MemoryBytes(8 * gib, gib, 0, gib, gib // 2, 0, 24 * gib, 2 * gib, gib, False)
    assert host_ram_terms(beside_gpu).startswith("the plan keeps 3.0 GiB in host RAM beside")


def test_cublas_finding_no_memory_on_a_split_card_is_the_gpu_out_of_memory():
    """The engine's last lines when a split's second card was short (two H200s,
    benchmarks/results/h200x2-two-gpus-planned-vs-run.json): an abort that is the GPU out of
    memory."""
    lines = [
        "0.02.046.717 E CUDA error: the resource allocation failed",
        "0.02.046.725 E   current device: 1, in function cublas_handle at common.cuh:1534",
        "0.02.046.725 E   cublasCreate_v2(&cublas_handles[device][curr_stream_no])",
    ]
    assert name_death(-signal.SIGABRT, lines, DeathFacts()).code == "gpu-out-of-memory"
