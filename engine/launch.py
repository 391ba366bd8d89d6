"""Launch (pure): a plan and the user's choices -> llama-server argv and environment.

No shell is involved: paths with spaces and quotes pass as they are. The API key travels in
the environment (``LLAMA_API_KEY``), never in argv where ``ps`` would show it.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass

from lucebox.engine.errors import UsageError
from lucebox.engine.plan import Plan


@dataclass(frozen=True)
class LaunchSpec:
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
    api_key: str | None = None
    sampling: tuple[tuple[str, float], ...] = ()


_SAMPLING_FLAGS = {
    "temperature": "--temp",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
}


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_api_key() -> str:
    return f"lb-{secrets.token_urlsafe(24)}"


def server_argv(spec: LaunchSpec) -> list[str]:
    """The exact llama-server command line for ``spec``."""
    if not is_loopback(spec.host) and not spec.api_key:
        raise UsageError(
            f"binding {spec.host} exposes the server beyond this machine without an API key",
            hint="set server.api_key (lucebox generates one when you bind beyond loopback)",
        )
    argv = [
        spec.server_path,
        "-m",
        spec.model_path,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--alias",
        spec.alias,
        "--metrics",
        *spec.plan.server_flags(),
    ]
    if spec.chat_template:
        argv += ["--chat-template", spec.chat_template]
    else:
        argv.append("--jinja")
    if spec.spec_type:
        argv += ["--spec-type", spec.spec_type]
        if spec.draft_path:
            # The draft's KV cache has the target's type: the plan priced it so.
            kv = (spec.plan.cache_type_k, spec.plan.cache_type_v)
            argv += ["-md", spec.draft_path, "-ctkd", kv[0], "-ctvd", kv[1]]
        if spec.draft_max:
            argv += ["--spec-draft-n-max", str(spec.draft_max)]
        if spec.draft_p_min is not None:
            argv += ["--spec-draft-p-min", f"{spec.draft_p_min:g}"]
    for name, value in spec.sampling:
        flag = _SAMPLING_FLAGS.get(name)
        if flag:
            argv += [flag, f"{value:g}"]
    return argv


def server_env(spec: LaunchSpec) -> dict[str, str]:
    """Environment additions for the engine process."""
    return {"LLAMA_API_KEY": spec.api_key} if spec.api_key else {}


def url_of(spec: LaunchSpec) -> str:
    host = "127.0.0.1" if spec.host in ("0.0.0.0", "") else spec.host
    return f"http://{host}:{spec.port}"
