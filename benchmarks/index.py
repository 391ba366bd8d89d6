"""The benchmarks' index: the question each answers, how to run it, on which machine, and where
its figures are kept. `python -m benchmarks` prints it; `python -m benchmarks NAME ARGS...` runs
one. A GPU benchmark runs on the device machine through a script in ``device/`` (``Driver``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    """The module in benchmarks/ (``python -m benchmarks NAME``)."""
    question: str
    machine: str
    """``cpu`` (this machine or any PC), ``gpu`` (the device machine), ``tool`` (writes inputs)."""
    results: str = ""
    """Where its figures are kept (benchmarks/results/...), or "" when it prints them."""
    driver: str = ""
    """The script in benchmarks/device/ that runs it on a GPU machine."""


INDEX = (
    Benchmark(
        "plan_snapshots",
        "Does a refactor of the planner leave every plan document byte-identical?",
        "cpu",
    ),
    Benchmark("cpu_plan_leaves_pc_usable", "Does a CPU plan leave the PC usable?", "cpu"),
    Benchmark(
        "plan_memory_vs_gpu",
        "Is the plan right on my card (VRAM planned vs shown, the largest context that loads)?",
        "gpu",
        driver="device_plan.sh",
    ),
    Benchmark(
        "launch_matches_plan_gpu",
        "Does `lucebox serve` launch what its plan said, on a real GPU?",
        "gpu",
        driver="device_launch.sh",
    ),
    Benchmark(
        "engine_choice_on_auto",
        "Does `lucebox serve` with nothing pinned compare both engines by itself?",
        "gpu",
        "results/h100-engine-choice-on-auto.json",
        "device_auto_choice.sh",
    ),
    Benchmark(
        "engine_choice_measured",
        "Which engine is faster here, measured as the engine calibration measures them?",
        "gpu",
        "results/h200x2-engine-choice.json",
        "device_engine_choice.sh",
    ),
    Benchmark(
        "spec_breakeven",
        "At what acceptance does each speculation mode pay in the pinned engine?",
        "cpu",
        "results/cpu-spec-breakeven-head128-q8.json",
    ),
    Benchmark(
        "agent_prompt_cache",
        "How much of an agent's prompts does the prompt cache serve (a recorded session replayed)?",
        "cpu",
    ),
    Benchmark(
        "conversation_survives_restart",
        "Is an agent's next turn warm after a stop and start, and after a calibration's probe?",
        "cpu",
        "results/cpu-conversation-survives-restart.json",
    ),
    Benchmark(
        "vision_prompt_reuse",
        "What does serving a vision projector do to an agent's prompt reuse?",
        "cpu",
        "results/cpu-vision-replay.json",
    ),
    Benchmark(
        "vision_on_gpu",
        "Does a text model with its projector serve images on the GPU as planned?",
        "gpu",
        "results/h200-vision.json",
        "device_vision.sh",
    ),
    Benchmark(
        "long_prompt_modes_gpu",
        "How do the long-context modes (exact, KVFlash, PFlash) answer long prompts on the GPU?",
        "gpu",
        "results/h200x2-pflash-bsa.json",
        "device_pflash.sh",
    ),
    Benchmark(
        "lucebox_memory_by_stage",
        "What does the Lucebox engine hold on the GPU at each stage, and at its peak?",
        "gpu",
        "results/h200-lucebox-memory.json",
        "device_lucebox_memory.sh",
    ),
    Benchmark(
        "two_gpus_planned_vs_run",
        "On two GPUs, does each engine run as planned?",
        "gpu",
        "results/h200x2-two-gpu.json",
        "device_two_gpu.sh",
    ),
    Benchmark(
        "rpc_peer_vs_gpu",
        "Does a GPU plus a `lucebox worker` peer run as planned?",
        "gpu",
        driver="device_rpc.sh",
    ),
    Benchmark(
        "engine_faults",
        "Does every engine fault get named and recovered from?",
        "cpu",
        "results/cpu-faults.json",
    ),
    Benchmark(
        "engine_update_cpu",
        "Does `engine update` self-test and switch builds on this machine?",
        "cpu",
        "results/cpu-engine-update.json",
    ),
    Benchmark(
        "engine_update_gpu",
        "Does the Lucebox engine's update self-test and switch on the GPU?",
        "gpu",
        "results/h200-lucebox-engine-update.json",
        "device_engine_update.sh",
    ),
    Benchmark(
        "live_numbers",
        "Do the live numbers (status, dashboard) match the engine's own?",
        "cpu",
        "results/cpu-live-numbers.json",
    ),
    Benchmark(
        "status_cost",
        "What CPU does one `lucebox status --json` cost?",
        "cpu",
        "results/cpu-status-cost.json",
    ),
    Benchmark("tui_overhead", "What does the dashboard cost the server?", "cpu"),
    Benchmark(
        "serve_overhead", "What does `lucebox serve` add to the engine it supervises?", "cpu"
    ),
    Benchmark(
        "front_overhead",
        "What does lucebox's front cost a client?",
        "cpu",
        "results/cpu-front-overhead.json",
    ),
    Benchmark(
        "front_clients_gpu",
        "How do clients of the front fare over a running serve on the GPU?",
        "gpu",
        "results/h200-lucebox-front.json",
        "device_front.sh",
    ),
    Benchmark(
        "set_model_switch_time",
        "How long does a served set take to switch models?",
        "cpu",
        "results/cpu-model-switch.json",
    ),
    Benchmark(
        "model_check_reads_header",
        "Does `models check` read only the header, in well under a second?",
        "cpu",
    ),
    Benchmark("pull_throughput", "Does `models pull` download as fast as plain curl?", "cpu"),
    Benchmark(
        "download_resumes",
        "Does a download cut five times finish as fast as one that is not?",
        "cpu",
    ),
    Benchmark(
        "webui_build_cost", "What does the web UI add to an engine build, cold and cached?", "cpu"
    ),
    Benchmark(
        "cpu_baseline_cost",
        "What does the shipped CPU baseline cost against a native build?",
        "cpu",
        "results/cpu-baseline-cost.json",
    ),
    Benchmark(
        "lucebox_models",
        "Writes the generated models the Lucebox engine is measured with on the GPU.",
        "tool",
    ),
    Benchmark("partial_head", "Writes a target whose MTP head agrees part of the time.", "tool"),
)


def by_name(name: str) -> Benchmark | None:
    return next((b for b in INDEX if b.name == name), None)


def text() -> str:
    """The index as a person reads it."""
    lines = []
    for bench in INDEX:
        where = f" -> benchmarks/{bench.results}" if bench.results else ""
        driver = f" (on the device: benchmarks/device/{bench.driver})" if bench.driver else ""
        lines.append(f"{bench.name} [{bench.machine}]{where}{driver}\n    {bench.question}")
    return "\n".join(lines)
