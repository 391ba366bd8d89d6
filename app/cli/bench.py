"""``lucebox bench quick`` and ``lucebox bench replay``: the command line over the benches.

Both measure the running server (``lucebox status`` knows its URL), or with ``--compare`` two
configurations that lucebox serves one after the other (:mod:`lucebox.engine.bench.compare`).
Tables go to stdout, progress and warnings to stderr; ``--json`` prints one document.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lucebox.app.cli.handler import Command, group_help
from lucebox.engine import pipeline
from lucebox.engine.bench.between import (
    EVENT_FORMS,
    BetweenTurn,
    parse_between,
    read_tokens,
    replay_between,
)
from lucebox.engine.bench.compare import (
    ServeConfig,
    Served,
    compare_form,
    parse_compare,
    refuse_running,
    restartable,
    run_configs,
)
from lucebox.engine.bench.measure import CallSample
from lucebox.engine.bench.quick import engines_verdict, probes_tok_s, run_quick, sample_json
from lucebox.engine.bench.recalibration import put_back_left_aside, refuse_without_calibration
from lucebox.engine.bench.replay import ReplayCall, ReplayResult, replay
from lucebox.engine.bench.transcript import Transcript, parse_transcript
from lucebox.engine.core.errors import EXIT_OK, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.machine.apikey import client_api_key
from lucebox.engine.plan.flagtypes import positive_int
from lucebox.engine.run import runstate
from lucebox.engine.run.front.samplingmix import client_fields

Result = TypeVar("Result")


def _note(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def _measure(
    args: argparse.Namespace,
    paths: Paths,
    axes: tuple[str, ...],
    workload: Callable[[Served], Result],
) -> list[tuple[ServeConfig, Result]]:
    """Run ``workload`` on each --compare configuration, or once on the server at hand."""
    if args.compare:
        configs = parse_compare(args.compare, axes)
        options = pipeline.ServeOptions(
            preset=args.preset, model=args.model, draft=args.draft, ctx=args.ctx
        )
        return run_configs(paths, options, configs, workload, on_note=_note)
    if args.preset or args.model or args.draft or args.ctx:
        raise UsageError(
            "--preset, --model, --draft and --ctx choose what --compare serves",
            hint="without --compare the bench measures the running server as it is",
        )
    url = getattr(args, "url", None)
    model = None
    engine_log = None
    sampling = None
    # lucebox's own key goes to lucebox's own server only, never to a --url of another host.
    api_key = None
    if url is None:
        api_key = client_api_key(paths, config.load_settings(paths).api_key)
        status = runstate.current_status(paths)
        if status.state != "ready" or status.url is None:
            raise UsageError(
                f"no lucebox server is ready (state: {status.state})",
                hint=f"start one with `lucebox serve`, or use --compare {compare_form(axes[0])}",
            )
        url, model = status.url, status.model
        engine_log = Path(status.log) if status.log else None
        sampling = status.sampling
    default = ServeConfig("default")
    served = Served(url.rstrip("/"), model, api_key, default, engine_log, sampling)
    return [(default, workload(served))]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


# --- bench quick ------------------------------------------------------------------------------


def cmd_bench_quick(args: argparse.Namespace, paths: Paths) -> int:
    sampled_at: dict[str, dict[str, Any]] = {}

    def workload(served: Served) -> dict[str, CallSample]:
        sampled_at[served.config.name] = client_fields(served.sampling)
        return run_quick(
            served,
            max_tokens=args.n_gen,
            on_sample=lambda name, s: _note(
                f"{served.config.name} {name}: {_fmt(s.decode_tok_s, '.1f')} tok/s"
            ),
        )

    results = _measure(args, paths, ("spec", "engine"), workload)
    if args.json:
        document: dict[str, Any] = {
            "configs": {
                serve.name: {name: sample_json(s) for name, s in samples.items()}
                for serve, samples in results
            },
            "sampling": sampled_at,
        }
        if len(results) == 2:
            (_, first), (_, second) = results
            document["decode_ratio"] = {
                name: _plain_ratio(first[name].decode_tok_s, second[name].decode_tok_s)
                for name in first
            }
            document["decode_ratio"]["probes"] = _plain_ratio(
                probes_tok_s(first, args.n_gen), probes_tok_s(second, args.n_gen)
            )
            document["prefill_ratio"] = {
                name: _plain_ratio(first[name].prefill_tok_s, second[name].prefill_tok_s)
                for name in first
            }
            document["ttft_ratio"] = {
                name: _plain_ratio(first[name].ttft_s, second[name].ttft_s) for name in first
            }
            engines = engines_verdict(results, args.n_gen)
            if engines is not None:
                document["engine_verdict"] = {"kind": engines[0], "reason": engines[1]}
        print(json.dumps(document, indent=2))
        return EXIT_OK
    width = max(10, *(len(serve.name) for serve, _ in results))
    header = (
        f"{'config':<{width}} {'prompt':<6} {'ttft s':>7} {'prefill t/s':>11} "
        f"{'decode t/s':>10} {'accepted':>9}"
    )
    print(header)
    for serve, samples in results:
        for name, s in samples.items():
            print(
                f"{serve.name:<{width}} {name:<6} {_fmt(s.ttft_s, '.3f'):>7} "
                f"{_fmt(s.prefill_tok_s, '.1f'):>11} {_fmt(s.decode_tok_s, '.1f'):>10} "
                f"{_fmt(s.acceptance, '.0%'):>9}"
            )
    if len(results) == 2:
        (first_config, first), (second_config, second) = results
        print(f"\n{first_config.name} / {second_config.name}:    decode  prefill     ttft")
        for name in first:
            a, b = first[name], second[name]
            print(
                f"  {name:<6} {_ratio(a.decode_tok_s, b.decode_tok_s):>8} "
                f"{_ratio(a.prefill_tok_s, b.prefill_tok_s):>8} {_ratio(a.ttft_s, b.ttft_s):>8}"
            )
        weighted = _ratio(probes_tok_s(first, args.n_gen), probes_tok_s(second, args.n_gen))
        print(f"  probes {weighted:>8} decode (token-weighted, as the calibration measures)")
        engines = engines_verdict(results, args.n_gen)
        if engines is not None:
            print(f"\nthe engine calibration would serve {engines[0]}: {engines[1]}")
    return EXIT_OK


def _plain_ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else round(a / b, 3)


# --- bench replay -----------------------------------------------------------------------------


def read_transcript(path: Path) -> Transcript:
    try:
        text = path.read_text("utf-8", errors="replace")
    except FileNotFoundError:
        raise UsageError(
            f"{path}: no such transcript", hint="give a Claude Code .jsonl file"
        ) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror})") from None
    transcript = parse_transcript(text.splitlines())
    for warning in transcript.warnings:
        _warn(f"{path.name}: {warning}")
    if not transcript.call_starts:
        raise UsageError(
            f"{path}: no assistant turns to replay",
            hint="a Claude Code session file (~/.claude/projects/*/*.jsonl) has them",
        )
    return transcript


def _print_call(name: str, call: ReplayCall) -> None:
    s = call.sample
    _note(
        f"{name} call {call.index}: ttft {_fmt(s.ttft_s, '.2f')} s, prompt {s.prompt_tokens} "
        f"({s.cached_tokens} cached)" + (", EMPTY reply" if s.empty else "")
    )


def cmd_bench_replay(args: argparse.Namespace, paths: Paths) -> int:
    if args.url and args.compare:
        raise UsageError(
            "--url and --compare exclude each other",
            hint="--url measures a server as it is; --compare starts its own",
        )
    transcript = read_transcript(args.transcript)
    if args.between is not None:
        return _replay_between(args, paths, transcript)

    def workload(served: Served) -> ReplayResult:
        return replay(
            served,
            transcript,
            n_gen=args.n_gen,
            calls=args.calls,
            on_call=lambda call: _print_call(served.config.name, call),
            on_warning=_warn,
        )

    results = _measure(args, paths, ("cache", "vision"), workload)
    if args.json:
        print(
            json.dumps(
                {"configs": {serve.name: result.to_json() for serve, result in results}},
                indent=2,
            )
        )
        return EXIT_OK
    print(
        f"{'config':<10} {'call':>4} {'ttft s':>7} {'prompt':>7} {'cached':>7} {'decode t/s':>10}"
    )
    for serve, result in results:
        for call in result.calls:
            s = call.sample
            print(
                f"{serve.name:<10} {call.index:>4} {_fmt(s.ttft_s, '.3f'):>7} "
                f"{s.prompt_tokens or 0:>7} {s.cached_tokens or 0:>7} "
                f"{_fmt(s.decode_tok_s, '.1f'):>10}" + ("  EMPTY" if s.empty else "")
            )
    print()
    for serve, result in results:
        print(
            f"{serve.name:<10} ttft total {result.ttft_total_s:.2f} s "
            f"(warm calls {result.warm_ttft_total_s:.2f} s), wall {result.wall_s:.1f} s, "
            f"{result.empty} empty, {len(result.skipped)} skipped"
        )
    if len(results) == 2:
        (first_config, first), (second_config, second) = results
        print(
            f"{first_config.name} / {second_config.name}: "
            f"ttft {_ratio(first.ttft_total_s, second.ttft_total_s)}, "
            f"warm ttft {_ratio(first.warm_ttft_total_s, second.warm_ttft_total_s)}, "
            f"wall {_ratio(first.wall_s, second.wall_s)}"
        )
    return EXIT_OK


def _replay_between(args: argparse.Namespace, paths: Paths, transcript: Transcript) -> int:
    """``--between EVENT``: the bench serves its own server, so it can stop and start it."""
    between = parse_between(args.between)
    if args.url or args.compare:
        raise UsageError(
            "--between goes with neither --url nor --compare",
            hint="--between starts its own server from --model or --preset",
        )
    if not (args.model or args.preset):
        raise UsageError(
            "--between needs --model or --preset: the bench serves its own server to restart",
            hint="stop yours with `lucebox down` first",
        )
    refuse_running(paths, "--between")
    options = pipeline.ServeOptions(
        preset=args.preset, model=args.model, draft=args.draft, ctx=args.ctx
    )
    if between.kind == "calibrate":
        put_back = put_back_left_aside(paths)
        if put_back is not None:
            _note(f"calibrate: your measurements put back from {put_back}, a killed bench's copy")
        refuse_without_calibration(paths, options, _step_note)
    _note(f"{between.kind}: starting lucebox serve")
    with restartable(paths, options, ServeConfig("default")) as server:

        def event() -> Served:
            if between.kind == "calibrate":
                _note("calibrate: restarting lucebox serve unmeasured, until it has calibrated")
                served = server.calibrate()
                _note(f"calibrate: measured; it serves {server.verdict}")
                return served
            if between.model is None:
                _note("restart: stopping and starting lucebox serve")
                return server.restart()
            _note(f"swap: serving {between.model}, then the model again")
            return server.swap(pipeline.ServeOptions(model=between.model, ctx=args.ctx))

        turns = replay_between(
            server.served,
            transcript,
            event,
            event_name=between.kind,
            n_gen=args.n_gen,
            calls=args.calls,
            on_turn=lambda turn: _note(_between_line(turn)),
        )
    if args.json:
        print(json.dumps({"between": [turn.to_json() for turn in turns]}, indent=2))
        return EXIT_OK
    print(f"{'call':>4} {'event':<9} {'after s':>8} {'warm s':>7} {'cold s':>7} {'read':>11}")
    for turn in turns:
        after = turn.after
        read = f"{read_tokens(after)}/{after.prompt_tokens}"
        print(
            f"{turn.index:>4} {turn.event:<9} {turn.after.ttft_s:>8.3f} "
            f"{turn.warm.ttft_s:>7.3f} {turn.cold.ttft_s:>7.3f} {read:>11}"
        )
    return EXIT_OK


def _step_note(event: pipeline.StepEvent) -> None:
    """A step of preparing the launch; a download's or build's progress is left out."""
    if event.fraction is None:
        _note(f"{event.step}: {event.message}")


def _between_line(turn: BetweenTurn) -> str:
    kept = turn.kept_share
    return (
        f"call {turn.index} after {turn.event}: ttft {turn.after.ttft_s:.2f} s "
        f"(warm {turn.warm.ttft_s:.2f} s, cold {turn.cold.ttft_s:.2f} s), read "
        f"{read_tokens(turn.after)} of {turn.after.prompt_tokens} prompt tokens"
        + ("" if kept is None else f", {kept:.0%} of the warm cache kept")
    )


# --- registration -----------------------------------------------------------------------------


Count = Callable[[str], int]


def _add_compare_options(
    parser: argparse.ArgumentParser, forms: str, count: Count, serving: str = "--compare"
) -> None:
    parser.add_argument(
        "--compare",
        metavar=forms,
        help="serve two configurations one after the other and compare them",
    )
    parser.add_argument("--preset", metavar="ID", help=f"with {serving}: the preset to serve")
    parser.add_argument("--model", metavar="SRC", help=f"with {serving}: the model to serve")
    parser.add_argument(
        "--draft",
        metavar="SRC",
        help=f"with {serving}: its draft model (a Lucebox draft serves DDTree on that engine)",
    )
    parser.add_argument("--ctx", type=count, metavar="N", help=f"with {serving}: context")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def register(commands: Any, command: Command) -> None:
    """``lucebox bench``: ``bench replay`` and ``bench quick``."""
    bench: argparse.ArgumentParser = command(
        "bench", "measure the running server", lambda a, p: group_help(bench), commands
    )
    bench_cmds = bench.add_subparsers(dest="bench_command", metavar="COMMAND")
    count = positive_int
    replay_cmd = command(
        "replay",
        "replay an agent transcript (Claude Code JSONL) call by call and time each call",
        cmd_bench_replay,
        bench_cmds,
    )
    replay_cmd.add_argument("transcript", metavar="TRANSCRIPT.jsonl", type=Path)
    replay_cmd.add_argument(
        "--n-gen", type=count, default=64, metavar="N", help="tokens per reply (64)"
    )
    replay_cmd.add_argument(
        "--calls", type=count, metavar="N", help="replay only the first N calls"
    )
    _add_compare_options(
        replay_cmd, "cache=on,off | vision=on,off", count, "--compare or --between"
    )
    replay_cmd.add_argument(
        "--between",
        metavar=EVENT_FORMS,
        help="serve --model or --preset and restart it (calibrate: restart it to measure its "
        "speculation once idle, as a first serve does; swap: serve MODEL and then it again) "
        "before each call; each call's TTFT after that against the same call warm and cold",
    )
    replay_cmd.add_argument("--url", metavar="U", help="measure the server at this URL instead")
    quick = command(
        "quick",
        "a fixed prompt set: TTFT, prefill and decode tok/s, speculative acceptance",
        cmd_bench_quick,
        bench_cmds,
    )
    quick.add_argument(
        "--n-gen", type=count, metavar="N", help="cap every reply at N tokens (a smoke run)"
    )
    _add_compare_options(
        quick, "spec=on,off[,mtp,dflash,draft,ngram] | engine=lucebox,llama-server", count
    )
