"""``lucebox doctor``: what this machine can do, one line per check with what to do next."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from lucebox.app.cli.args import add_json, print_json
from lucebox.app.cli.handler import Command
from lucebox.engine import doctor
from lucebox.engine.core.errors import EXIT_OK
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config, gpu


def doctor_json(report: doctor.DoctorReport) -> dict[str, Any]:
    probe = report.probe
    return {
        "gpu_status": probe.status,
        "gpu_detail": probe.detail,
        "gpus": [
            {
                **{k: v for k, v in dataclasses.asdict(g).items() if k != "processes"},
                "driver_version": probe.driver_version,
                "cuda_driver_version": probe.cuda_driver_version,
                "processes": [dataclasses.asdict(p) for p in g.processes],
            }
            for g in probe.gpus
        ],
        "checks": [dataclasses.asdict(c) for c in report.checks],
    }


def cmd_doctor(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    report = doctor.run_doctor(paths, gpu.probe_gpus(), settings.engine_id)
    if args.json:
        print_json(doctor_json(report))
        return EXIT_OK
    width = max(len(c.name) for c in report.checks)
    for check in report.checks:
        print(f"{check.verdict:<8} {check.name:<{width}}  {check.detail}")
        if check.action:
            print(f"{'':<8} {'':<{width}}  -> {check.action}")
    return EXIT_OK


def register(commands: Any, command: Command) -> None:
    doc = command(
        "doctor",
        "GPU, driver, CUDA toolkit, cmake, compiler, disk, engine, models",
        cmd_doctor,
        commands,
    )
    add_json(doc)
