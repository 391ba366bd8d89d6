"""The benchmarks' index: the question each answers, how to run it, on which machine, and where
its figures are kept. `python -m benchmarks` prints it; `python -m benchmarks NAME ARGS...` runs
one here. On a lent GPU machine one driver runs them, `bash benchmarks/device/drive.sh STEP`:
its shared steps set the machine up (wheels, engine builds, generated models, serve, collect)
and its other steps are named as the entries here (``device_step``). A results file is named
``results/<machine>-<name>[-<variant>].json``, machine being where it ran (cpu, h100, h200,
h200x2, h200x4), and carries the command that made it (its "command" key)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    """The module in benchmarks/ (``python -m benchmarks NAME``), or the driver's step alone."""
    question: str
    machine: str
    """``cpu`` (this machine or any PC), ``gpu`` (the device machine), ``tool`` (writes inputs)."""
    results: tuple[str, ...] = ()
    """Where its figures are kept (``results/<machine>-<name>[-<variant>].json``), each file
    with the command that made it; empty when it prints them."""
    device_step: str = ""
    """The step of benchmarks/device/drive.sh that runs it on a GPU machine, "" when none."""


DRIVER = "bash benchmarks/device/drive.sh"
"""The one driver of a lent GPU machine; `bash benchmarks/device/drive.sh steps` lists its steps."""

INDEX = (
    Benchmark(
        "plan_snapshots",
        "Does a refactor of the planner leave every plan document byte-identical?",
        "cpu",
        results=("results/cpu-plan-snapshots-stage1.json",),
    ),
    Benchmark("cpu_plan_leaves_pc_usable", "Does a CPU plan leave the PC usable?", "cpu"),
    Benchmark(
        "plan_memory_vs_gpu",
        "Is the plan right on my card (VRAM planned vs shown, the largest context that loads)?",
        "gpu",
        device_step="plan_memory_vs_gpu",
    ),
    Benchmark(
        "launch_matches_plan_gpu",
        "Does `lucebox serve` launch what its plan said, on a real GPU?",
        "gpu",
        device_step="launch_matches_plan_gpu",
    ),
    Benchmark(
        "engine_build_gpu",
        "Does lucebox build each engine for the card by itself, with or without a CUDA toolkit?",
        "gpu",
        results=("results/h200-engine-build-gpu-lucebox-bsa.json",),
        device_step="engine_build_gpu",
    ),
    Benchmark(
        "spec_verdict_near_best",
        "Does the speculation mode serve keeps decode within 5% of the best `bench quick` "
        "measures at the same sampling?",
        "cpu",
        results=("results/cpu-spec-verdict-near-best.json",),
    ),
    Benchmark(
        "engine_choice_on_auto",
        "Does `lucebox serve` with nothing pinned compare both engines by itself?",
        "gpu",
        results=(
            "results/h100-engine-choice-on-auto.json",
            "results/h100-engine-choice-on-auto-partial-draft.json",
            "results/h100-engine-choice-on-auto-partial-draft-t0.json",
            "results/h100-engine-choice-on-auto-partial-draft-t07.json",
        ),
        device_step="engine_choice_on_auto",
    ),
    Benchmark(
        "conversation_after_restart_gpu",
        "Is a 50K-token conversation warm after `lucebox down` and `serve` on a GPU, per engine?",
        "gpu",
        results=(
            "results/h100-conversation-after-restart-gpu.json",
            "results/h100-conversation-after-restart-gpu-lucebox-plan.json",
        ),
        device_step="conversation_after_restart_gpu",
    ),
    Benchmark(
        "decode_spread_gpu",
        "How far apart do launches of one plan decode, and is it warm-up, clocks or noise?",
        "gpu",
        results=(
            "results/h100-decode-spread-gpu.json",
            "results/h100-decode-spread-gpu-warmup.json",
        ),
        device_step="decode_spread_gpu",
    ),
    Benchmark(
        "engine_choice_measured",
        "Which engine is faster here, measured as the engine calibration measures them?",
        "gpu",
        results=("results/h200x2-engine-choice-measured.json",),
        device_step="engine_choice_measured",
    ),
    Benchmark(
        "spec_breakeven",
        "At what acceptance does each speculation mode pay in the pinned engine?",
        "cpu",
        results=(
            "results/cpu-spec-breakeven-head128-q8.json",
            "results/cpu-spec-breakeven-head128-q4.json",
            "results/h100-spec-breakeven-q8-61mb.json",
            "results/h100-spec-breakeven-f16-1.7gb.json",
        ),
        device_step="spec_breakeven",
    ),
    Benchmark(
        "sampled_acceptance",
        "At the acceptance real drafts give under sampling, what does each speculation mode "
        "decode, greedy against temperature 0.7?",
        "cpu",
        results=("results/h100-sampled-acceptance.json",),
        device_step="sampled_acceptance",
    ),
    Benchmark(
        "spec_calibration_gpu",
        "Does the speculation calibration keep the fastest mode for each head on the GPU?",
        "gpu",
        results=("results/h100-spec-calibration-gpu.json",),
        device_step="spec_calibration_gpu",
    ),
    Benchmark(
        "agent_prompt_cache",
        "How much of an agent's prompts does the prompt cache serve (a recorded session replayed)?",
        "cpu",
    ),
    Benchmark(
        "front_door_holds",
        "Does the front door hold against 1,000+ hostile bodies, idle and slow connections?",
        "cpu",
        results=("results/cpu-front-door-holds.json",),
    ),
    Benchmark(
        "conversation_survives_restart",
        "Is an 8K+ agent chat's next turn within 1.5x of warm after a restart, calibration, sleep,"
        " eviction from a served set?",
        "cpu",
        ("results/cpu-conversation-survives-restart.json",),
    ),
    Benchmark(
        "several_users",
        "Four people at once: the N-user plan against one slot, and the agent's warm turn?",
        "cpu",
        results=("results/cpu-several-users.json",),
    ),
    Benchmark(
        "vision_prompt_reuse",
        "What does serving a vision projector do to an agent's prompt reuse?",
        "cpu",
        results=("results/cpu-vision-prompt-reuse.json",),
    ),
    Benchmark(
        "vision_on_gpu",
        "Does a text model with its projector serve images on the GPU as planned?",
        "gpu",
        results=("results/h200-vision-on-gpu.json",),
        device_step="vision_on_gpu",
    ),
    Benchmark(
        "long_prompt_modes_gpu",
        "How do the long-context modes (exact, KVFlash, PFlash) answer long prompts on the GPU?",
        "gpu",
        results=(
            "results/h200x2-long-prompt-modes-gpu-pflash.json",
            "results/h200x2-long-prompt-modes-gpu-kv.json",
            "results/h200x2-long-prompt-modes-gpu-kv-held.json",
            "results/h200x4-long-prompt-modes-gpu-kv-held.json",
        ),
        device_step="long_prompt_modes_gpu",
    ),
    Benchmark(
        "kv_calibration_gpu",
        "Does `lucebox serve` measure its long-context modes by itself and keep the best?",
        "gpu",
        results=("results/h200x2-kv-calibration-gpu.json",),
        device_step="kv_calibration_gpu",
    ),
    Benchmark(
        "lucebox_modes_gpu",
        "How does the Lucebox engine serve each of its modes, raw and through `lucebox serve`?",
        "gpu",
        results=("results/h100-lucebox-modes-gpu.json",),
        device_step="lucebox_modes_gpu",
    ),
    Benchmark(
        "lucebox_memory_by_stage",
        "What does the Lucebox engine hold on the GPU at each stage, and at its peak?",
        "gpu",
        results=(
            "results/h200-lucebox-memory-by-stage.json",
            "results/h200x2-lucebox-memory-by-stage-fit-4cf58a04.json",
        ),
        device_step="lucebox_memory_by_stage",
    ),
    Benchmark(
        "two_gpus_planned_vs_run",
        "On two GPUs, does each engine run as planned?",
        "gpu",
        results=(
            "results/h200x2-two-gpus-planned-vs-run.json",
            "results/h200x2-two-gpus-planned-vs-run-llama-server.json",
            "results/h200x2-two-gpus-planned-vs-run-both-engines.json",
        ),
        device_step="two_gpus_planned_vs_run",
    ),
    Benchmark(
        "rpc_peer_vs_gpu",
        "Does a GPU plus a `lucebox worker` peer run as planned?",
        "gpu",
        device_step="rpc_peer_vs_gpu",
    ),
    Benchmark(
        "engine_faults",
        "Does every engine fault get named and recovered from?",
        "cpu",
        results=(
            "results/cpu-engine-faults.json",
            "results/h200x2-engine-faults.json",
            "results/h200x2-engine-faults-second-lease.json",
        ),
        device_step="engine_faults",
    ),
    Benchmark(
        "engine_update_cpu",
        "Does `engine update` self-test and switch builds on this machine?",
        "cpu",
        results=("results/cpu-engine-update-cpu.json",),
    ),
    Benchmark(
        "engine_update_gpu",
        "Does the Lucebox engine's update self-test and switch on the GPU?",
        "gpu",
        results=("results/h200-engine-update-gpu.json",),
        device_step="engine_update_gpu",
    ),
    Benchmark(
        "live_numbers",
        "Do the live numbers (status, dashboard) match the engine's own?",
        "cpu",
        results=("results/cpu-live-numbers.json",),
    ),
    Benchmark(
        "status_cost",
        "What CPU does one `lucebox status --json` cost?",
        "cpu",
        results=("results/cpu-status-cost.json",),
    ),
    Benchmark(
        "tui_overhead",
        "What does the dashboard cost the server?",
        "cpu",
        device_step="tui_overhead",
    ),
    Benchmark(
        "serve_overhead",
        "What does `lucebox serve` add to the engine it supervises?",
        "cpu",
        device_step="serve_overhead",
    ),
    Benchmark(
        "serve_status_gpu",
        "Does `status --json` follow a long request on the GPU, and does `down` stop the engine?",
        "gpu",
        device_step="serve_status_gpu",
    ),
    Benchmark(
        "front_overhead",
        "What does lucebox's front cost a client?",
        "cpu",
        results=("results/cpu-front-overhead.json",),
    ),
    Benchmark(
        "front_clients_gpu",
        "How do clients of the front fare over a running serve on the GPU?",
        "gpu",
        results=(
            "results/h200-front-clients-gpu.json",
            "results/h200x2-front-clients-gpu-opencode.json",
        ),
        device_step="front_clients_gpu",
    ),
    Benchmark(
        "embeddings_beside",
        "Do embeddings beside the Lucebox engine answer fast, right, and past a running chat?",
        "gpu",
        results=("results/cpu-embeddings-beside.json", "results/h100-embeddings-beside.json"),
        device_step="embeddings_beside",
    ),
    Benchmark(
        "chat_page_gpu",
        "Does the chat page load and chat in front of the real Lucebox engine, asking for the key?",
        "gpu",
        results=("results/h100-chat-page-gpu.json",),
        device_step="chat_page_gpu",
    ),
    Benchmark(
        "set_model_switch_time",
        "How long does a served set take to switch models?",
        "cpu",
        results=("results/cpu-set-model-switch-time.json",),
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
        results=("results/cpu-cpu-baseline-cost.json",),
        device_step="cpu_baseline_cost",
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
    """The index as a person reads it: each benchmark, its question, how to run it here and on a
    GPU machine, and its results files."""
    lines = [
        "NAME [machine], its question, how to run it, -> its results (each with its command);",
        f"`{DRIVER} steps` lists the GPU machine's set-up steps too.",
        "",
    ]
    for bench in INDEX:
        lines += [f"{bench.name} [{bench.machine}]", f"    {bench.question}"]
        if bench.machine != "gpu":
            lines.append(f"    here: python -m benchmarks {bench.name}")
        if bench.device_step:
            lines.append(f"    GPU machine: {DRIVER} {bench.device_step}")
        lines.extend(f"    -> benchmarks/{path}" for path in bench.results)
    return "\n".join(lines)
