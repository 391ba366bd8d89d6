"""``lucebox worker``: the CLI over :mod:`lucebox.engine.run.rpcpeer`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lucebox.app.cli.handler import Command
from lucebox.engine.core.address import is_loopback
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import registry
from lucebox.engine.machine import config, gpu
from lucebox.engine.machine.peers import DEFAULT_RPC_PORT
from lucebox.engine.plan.flagtypes import port_number
from lucebox.engine.run import rpcpeer


def cmd_worker(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    probe = gpu.probe_gpus()
    engine = registry.select_engine(paths, probe, settings.engine_id).engine
    spec = rpcpeer.make_setup(
        paths, engine, probe, host=args.host, port=args.port, gpu_index=args.gpu,
        allow_lan=args.allow_lan,
    )  # fmt: skip
    assert engine is not None
    if not is_loopback(args.host):
        print(f"lucebox: warning: {rpcpeer.RISK.format(host=args.host, port=args.port)}",
              file=sys.stderr)  # fmt: skip
    log = paths.ensure(paths.logs_dir) / f"worker-{args.port}.log"
    return rpcpeer.run_worker(spec, engine, log, lambda line: print(line, flush=True))


def register(commands: Any, command: Command) -> None:
    sub = command(
        "worker",
        "lend this PC's GPU (or CPU) to another lucebox: the engine's RPC server",
        cmd_worker,
        commands,
    )
    sub.add_argument(
        "--port", type=port_number, default=DEFAULT_RPC_PORT, metavar="P",
        help=f"RPC port (default {DEFAULT_RPC_PORT}); the info endpoint is on the next one",
    )  # fmt: skip
    sub.add_argument("--host", default="127.0.0.1", metavar="H", help="address to bind")
    sub.add_argument("--gpu", type=int, metavar="N", help="the GPU to offer (NVML index)")
    sub.add_argument(
        "--allow-lan", action="store_true",
        help="bind beyond loopback anyway (the RPC server has no authentication)",
    )  # fmt: skip
