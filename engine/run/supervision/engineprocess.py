"""The engine's process: started in its own session and dying with lucebox, stopped by SIGTERM
then SIGKILL, and not started where another program holds its address."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import Awaitable, Callable

from lucebox.engine.engines import kinds
from lucebox.engine.machine.ports import next_free_port, port_holder
from lucebox.engine.plan.launch import ServerLaunch, engine_address, engine_environ
from lucebox.engine.run import prefixdisk
from lucebox.engine.run.death import EngineDeath, engine_missing, port_taken

STOP_TIMEOUT_S = 15.0
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    # The engine gets SIGKILL when lucebox dies, even by SIGKILL: no orphaned GPU holder.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def address_taken(launch: ServerLaunch) -> EngineDeath | None:
    """Why the engine cannot start when another program holds its address; None when free."""
    host, port = engine_address(launch)
    holder = port_holder(host, port)
    if holder is None:
        return None
    return port_taken(port, holder, next_free_port(host, port))


async def spawn(launch: ServerLaunch, argv: list[str]) -> asyncio.subprocess.Process | EngineDeath:
    """The engine's process, in its own session, dying with lucebox; why there is none when
    the binary is gone or cannot run (no retry helps)."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            env=engine_environ(launch, os.environ),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    except OSError as exc:
        build_command = kinds.kind(launch.kind).build_command
        return engine_missing(argv[0], exc.strerror or str(exc), build_command)


async def terminate(
    process: asyncio.subprocess.Process,
    launch: ServerLaunch,
    before_stop: Callable[[], Awaitable[None]] | None,
) -> None:
    """SIGTERM the engine's process group, wait, then SIGKILL; ``before_stop`` is awaited
    first while it still runs."""
    if process.returncode is not None:
        return
    if before_stop is not None:
        await before_stop()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(prefixdisk.stop_timeout_s(launch, STOP_TIMEOUT_S)):
            await process.wait()
    except TimeoutError:
        await kill(process)


async def kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the engine's process group and wait for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()
