"""Launch (pure): a plan and the user's choices -> the engine's argv and environment, by its kind.

No shell is involved: paths with spaces and quotes pass as they are. The engine reads the API
key from a file (``--api-key-file``), so the key is never in argv, where ``ps`` would show it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lucebox.engine.core.address import is_loopback
from lucebox.engine.core.errors import UsageError
from lucebox.engine.engines.registry import KindName
from lucebox.engine.plan.lucebox.luceboxlaunch import (
    ENGINE_ENV_PREFIXES,
    LOOPBACK,
    LuceboxFlags,
    dflash_server_argv,
    lucebox_env,
)
from lucebox.engine.plan.memory.memory import Plan


@dataclass(frozen=True)
class ServerLaunch:
    server_path: str
    model_path: str
    plan: Plan
    alias: str
    host: str = "127.0.0.1"
    port: int = 8080
    chat_template: str | None = None
    """A built-in template name the engine knows (for a base model used on purpose)."""
    draft_path: str | None = None
    spec_type: str | None = None
    """Speculative type; only set when the draft (if any) passed its guard."""
    draft_max: int | None = None
    draft_p_min: float | None = None
    api_key_file: str | None = None
    """The file the engine reads the key from; required to bind beyond loopback."""
    slot_save_path: str | None = None
    """Folder the engine saves and restores slots in (``/slots`` actions)."""
    gpus: tuple[int, ...] = ()
    """NVML indices of the GPUs the engine may see (in that order), when it runs on GPUs."""
    rpc: tuple[str, ...] = ()
    """``host:port`` of the RPC peers; the engine puts their devices before its GPUs."""
    sampling: tuple[tuple[str, float], ...] = ()
    router: tuple[str, ...] = ()
    """Set for a served set: llama-server runs as a router with these arguments (its preset file and
    limits, plan/servedset/router.py) after host, port and key file, and no model of its own."""
    kind: KindName = "llama-server"
    """The engine kind that serves: its argv and environment are built by that kind's rules."""
    lucebox: LuceboxFlags | None = None
    """The Lucebox engine's own switches (kind ``lucebox`` only)."""
    mmproj_path: str | None = None
    """The vision projector llama-server loads (``--mmproj``) when vision is served."""
    engine_port: int | None = None
    """The loopback port the engine listens on behind lucebox's front, which serves
    ``host:port`` (run/front/front.py); None: the engine serves ``host:port`` itself (a served
    set's router, behind its own proxy)."""


PRIVATE_PORT_OFFSET = 10000
"""The engine behind the front listens this far from the public port (8080 -> 18080)."""

_SAMPLING_FLAGS = {
    "temperature": "--temp",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
}


def server_argv(server: ServerLaunch) -> list[str]:
    """The exact engine command line for ``server``, by its kind's rules.

    Raises:
        UsageError: the address is beyond loopback and no API key guards it.
    """
    if not is_loopback(server.host) and not server.api_key_file:
        raise UsageError(
            f"binding {server.host} exposes the server beyond this machine without an API key",
            hint="lucebox generates a key file when you bind beyond loopback; or keep 127.0.0.1",
        )
    return _ARGV[server.kind](server)


def key_file_of(key_path: str, host: str, has_api_key: bool) -> str | None:
    """The key file a launch reads: with a key of the user's, or beyond loopback (``prepare``
    writes it; its path is known before the file exists); None otherwise."""
    return key_path if has_api_key or not is_loopback(host) else None


def private_port(public_port: int) -> int:
    """The loopback port the engine gets behind the front on ``public_port`` (a fixed rule,
    so a plan shows the port its launch uses)."""
    return (
        public_port + PRIVATE_PORT_OFFSET
        if public_port <= 65535 - PRIVATE_PORT_OFFSET
        else (public_port - PRIVATE_PORT_OFFSET)
    )


def engine_address(server: ServerLaunch) -> tuple[str, int]:
    """Where the engine itself listens: its private loopback port behind the front."""
    if server.engine_port is None:
        return server.host, server.port
    return LOOPBACK, server.engine_port


def engine_url(server: ServerLaunch) -> str:
    """The URL lucebox's own calls (health, samples, slots) and the front use for the engine."""
    return url_of_address(*engine_address(server))


def _lucebox_server_argv(server: ServerLaunch) -> list[str]:
    return dflash_server_argv(
        server.server_path,
        server.model_path,
        server.alias,
        engine_address(server)[1],
        _flags(server),
        server.draft_path,
    )


def _flags(server: ServerLaunch) -> LuceboxFlags:
    if server.lucebox is None:
        raise ValueError("a Lucebox engine launch carries its flags")
    return server.lucebox


def _llama_server_argv(server: ServerLaunch) -> list[str]:
    host, port = engine_address(server)
    if server.router:
        key_file = ["--api-key-file", server.api_key_file] if server.api_key_file else []
        address = ["--host", host, "--port", str(port)]
        return [server.server_path, *address, *key_file, *server.router]
    argv = [
        server.server_path,
        "-m",
        server.model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--alias",
        server.alias,
        "--metrics",
        *server.plan.server_flags(),
    ]
    if server.mmproj_path:
        argv += ["--mmproj", server.mmproj_path]
    if server.rpc:
        argv += ["--rpc", ",".join(server.rpc)]
    if server.api_key_file:
        argv += ["--api-key-file", server.api_key_file]
    if server.slot_save_path:
        argv += ["--slot-save-path", server.slot_save_path]
    if server.chat_template:
        argv += ["--chat-template", server.chat_template]
    else:
        argv.append("--jinja")
    if server.spec_type:
        argv += ["--spec-type", server.spec_type]
        if server.draft_path:
            # The draft's KV cache has the target's type: the plan priced it so.
            kv = (server.plan.cache_type_k, server.plan.cache_type_v)
            argv += ["-md", server.draft_path, "-ctkd", kv[0], "-ctvd", kv[1]]
        if server.draft_max:
            argv += ["--spec-draft-n-max", str(server.draft_max)]
        if server.draft_p_min is not None:
            argv += ["--spec-draft-p-min", f"{server.draft_p_min:g}"]
    for name, value in server.sampling:
        flag = _SAMPLING_FLAGS.get(name)
        if flag:
            argv += [flag, f"{value:g}"]
    return argv


def _no_env(server: ServerLaunch) -> dict[str, str]:
    return {}


def _lucebox_server_env(server: ServerLaunch) -> dict[str, str]:
    return lucebox_env(_flags(server))


_ARGV: dict[KindName, Callable[[ServerLaunch], list[str]]] = {
    "llama-server": _llama_server_argv,
    "lucebox": _lucebox_server_argv,
}
_ENV: dict[KindName, Callable[[ServerLaunch], dict[str, str]]] = {
    "llama-server": _no_env,
    "lucebox": _lucebox_server_env,
}


def server_env(server: ServerLaunch) -> dict[str, str]:
    """Environment for the engine: it sees exactly the planned GPUs, numbered as NVML does
    (CUDA's own order puts the fastest first, which would mismatch the plan's split)."""
    engine = _ENV[server.kind](server)
    if not server.gpus:
        return engine
    return {
        **engine,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in server.gpus),
    }


def engine_environ(server: ServerLaunch, inherited: Mapping[str, str]) -> dict[str, str]:
    """The engine's whole environment: this process's, without the engine settings it would
    read from there (``LLAMA_ARG_*``, ``LLAMA_API_KEY``, the Lucebox engine's ``DFLASH*``:
    they would change the launch behind the plan's back), plus :func:`server_env`."""
    kept = {
        name: value
        for name, value in inherited.items()
        if not name.startswith(("LLAMA_ARG_", *ENGINE_ENV_PREFIXES)) and name != "LLAMA_API_KEY"
    }
    return {**kept, **server_env(server)}


def url_of(server: ServerLaunch) -> str:
    return url_of_address(server.host, server.port)


def url_of_address(host: str, port: int) -> str:
    """The URL a client on this machine uses for a server bound to ``host:port``."""
    client_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in client_host:
        client_host = f"[{client_host}]"
    return f"http://{client_host}:{port}"
