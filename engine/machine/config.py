"""Typed user settings in ``config.toml``: read with tomllib, written atomically with tomli-w.

A file that cannot be parsed or that holds unknown keys or wrong types is reported with the
file, the key and the expected type, and is never overwritten: ``reset_config`` keeps it as
``config.toml.bad-<timestamp>`` before writing defaults.

``LUCEBOX_SETTINGS`` holds TOML layered over the file for one process and the processes it
starts (the bench's own ``lucebox serve`` calibrating at once): checked as the file is, and
never written to it.
"""

from __future__ import annotations

import dataclasses
import os
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import tomli_w

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import ConfigError, PathsError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.peers import split_address


@dataclass(frozen=True)
class Settings:
    """What a user can set once instead of passing flags every time."""

    preset: str = ""
    """Preset id that ``lucebox up`` starts; empty means ask (TUI) or pick the best that fits."""
    host: str = "127.0.0.1"
    """Address the server binds; anything but loopback requires an API key."""
    port: int = 8080
    """TCP port of the OpenAI-compatible endpoint."""
    api_key: str = ""
    """Key clients must send when the server binds beyond loopback."""
    mdns_name: str = "lucebox"
    """The name lucebox answers to on the LAN (``lucebox.local``) while it serves beyond
    loopback; empty announces nothing."""
    allowed_origins: tuple[str, ...] = ()
    """Web origins (``http://192.168.1.20:3000``) whose pages may call the API from a browser;
    ``*`` allows every origin only when written out; empty: the front's own pages alone."""
    gpu_indices: tuple[int, ...] = ()
    """NVML indices of the GPUs to use; empty lets lucebox use every usable NVIDIA GPU."""
    ctx: int = 0
    """Context length in tokens; 0 lets the planner choose the largest that fits."""
    allow_base: bool = False
    """Serve base (non-instruct) models instead of refusing them."""
    spec: str = ""
    """Speculative decoding: auto, off, mtp, dflash, draft or ngram; empty is auto."""
    engine_id: str = ""
    """Engine id to use; empty picks the best installed engine for the GPU."""
    engine_kind: str = ""
    """Which engine serves: auto, llama-server or lucebox; empty is auto (the planner picks)."""
    download_max_idle_attempts: int = 10
    """A download gives up after this many attempts in a row that brought no new byte."""
    download_stall_s: float = 30.0
    """A download connection that sends nothing for this long is dropped and resumed."""
    download_backoff_max_s: float = 60.0
    """Longest wait between download attempts (the waits double from 1 s up to this)."""
    rpc_peers: tuple[str, ...] = ()
    """``host:port`` of `lucebox worker` peers whose devices join the split."""
    models_served: tuple[str, ...] = ()
    """Presets or model sources served together on one endpoint (two or more: the router)."""
    models_idle_s: int = 3600
    """A model of a served set that serves nothing for this long is unloaded (frees its memory),
    its slot saved first; 0 never unloads one for idling."""
    models_ram_mib: int = 0
    """Without a GPU, the RAM a served set may use in MiB; 0: what is available."""
    calibrate_idle_s: float = 30.0
    """Measure speculation on this card once no client has sent a request for this long (the
    first time a model is served with speculation possible); 0 never measures."""
    probe_max_tokens: int = 0
    """Cap on each calibration probe's reply in tokens; 0 keeps each probe's own length."""
    keep_free_ram_mib: int = 0
    """RAM a plan leaves to the rest of the PC without a GPU; 0: max(2 GiB, 15% of the RAM)."""
    mmproj: str = ""
    """The vision projector to serve with the model (a path); empty: the one beside it."""
    vision: str = ""
    """Serve the projector: auto (when it costs no context), on, off; empty is auto."""
    image_urls: bool = False
    """Serve images off loopback although llama-server fetches any http(s) image URL a client
    names (it has no switch for it): false keeps vision off there."""
    sleep_idle_s: float = 0.0
    """After this long without a client request the engine stops (its conversation saved, its
    memory freed) while the server keeps listening; the next request starts it again; 0 never
    sleeps."""
    users: int = 1
    """People served at once: llama-server slots sharing one context (the plan seats fewer
    where each would get too little, and says); the Lucebox engine queues them."""
    hang_s: float = 60.0
    """A running request that makes no progress for this long counts as hung (a prompt gets
    longer by its length at the measured prefill rate): the engine, or the set's model process,
    is restarted and the request ends with an error; 0 never judges a request hung."""
    cpu_read_s: float = 300.0
    """Without a GPU the chosen context is at most what the CPU reads in this long (0: no
    bound); a context the user asks for is not bounded."""
    embed_model: str = ""
    """An embedding model served beside the chat model (a GGUF path or source) at
    ``/v1/embeddings``; empty serves none."""
    rerank_model: str = ""
    """A reranker model served beside the chat model at ``/v1/rerank``; empty serves none."""


# Dotted key in config.toml -> Settings field.
KEYS: dict[str, str] = {
    "preset": "preset",
    "server.host": "host",
    "server.port": "port",
    "server.api_key": "api_key",
    "server.allowed_origins": "allowed_origins",
    "server.mdns_name": "mdns_name",
    "server.hang_s": "hang_s",
    "server.sleep_idle_s": "sleep_idle_s",
    "server.users": "users",
    "gpu.indices": "gpu_indices",
    "model.ctx": "ctx",
    "model.allow_base": "allow_base",
    "model.spec": "spec",
    "engine.id": "engine_id",
    "engine.kind": "engine_kind",
    "download.max_idle_attempts": "download_max_idle_attempts",
    "download.stall_s": "download_stall_s",
    "download.backoff_max_s": "download_backoff_max_s",
    "rpc.peers": "rpc_peers",
    "models.served": "models_served",
    "models.idle_s": "models_idle_s",
    "models.ram_mib": "models_ram_mib",
    "spec.calibrate_idle_s": "calibrate_idle_s",
    "spec.probe_max_tokens": "probe_max_tokens",
    "machine.keep_free_ram_mib": "keep_free_ram_mib",
    "model.cpu_read_s": "cpu_read_s",
    "model.mmproj": "mmproj",
    "model.vision": "vision",
    "model.image_urls": "image_urls",
    "embeddings.model": "embed_model",
    "rerank.model": "rerank_model",
}

_FIELD_TYPES: dict[str, type] = {f.name: type(f.default) for f in dataclasses.fields(Settings)}
_STRING_LISTS = {"rpc_peers", "models_served", "allowed_origins"}
"""Tuple fields of strings; every other tuple holds non-negative integers."""
LEGACY_KEYS = {"gpu.index": "gpu.indices"}
"""Keys earlier versions wrote: read as their replacement, and rewritten on the next load."""


def _type_name(kind: type) -> str:
    names = {bool: "true/false", int: "integer", float: "number", str: "string"}
    return names.get(kind, "list of integers")


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and dotted not in KEYS:
            flat.update(_flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def _check_value(path: Path, key: str, value: object) -> object:
    if key in LEGACY_KEYS and isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{path}: key '{key}' must not be negative, found {value}")
        value = [value]
        key = LEGACY_KEYS[key]
    field = KEYS.get(key)
    if field is None:
        raise ConfigError(
            f"{path}: unknown key '{key}'",
            hint=f"known keys: {', '.join(KEYS)}; remove or rename it",
        )
    kind = _FIELD_TYPES[field]
    if kind is float and type(value) is int:
        value = float(value)  # `stall_s = 30` is a number too
    if field in _STRING_LISTS:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(
                f"{path}: key '{key}' should be a list of strings, found {value!r}",
                hint=f'write it as {key} = ["a", "b"], or run `lucebox config set {key} ...`',
            )
        if field == "allowed_origins":
            return tuple(_origin(f"{path}: key '{key}'", item) for item in value)
        return tuple(value)
    if kind is tuple:
        if not isinstance(value, list) or not all(
            type(item) is int and item >= 0 for item in value
        ):
            raise ConfigError(
                f"{path}: key '{key}' should be a list of non-negative integers, found {value!r}",
                hint=f"write it as {key} = [0, 1], or run `lucebox config set {key} 0,1`",
            )
        return tuple(value)
    # bool is an int in Python; keep the two apart so `port = true` is refused.
    if type(value) is not kind:
        raise ConfigError(
            f"{path}: key '{key}' should be a {_type_name(kind)}, found {value!r}",
            hint="fix that line or run `lucebox config set` to write a valid value",
        )
    if kind in (int, float) and isinstance(value, int | float) and not value >= 0:
        raise ConfigError(f"{path}: key '{key}' must not be negative, found {value}")
    return value


def _checked_fields(path: Path, text: str, hint: str) -> dict[str, Any]:
    """The settings fields ``text`` sets, each checked (``path`` only names it)."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", hint=hint) from exc
    values: dict[str, Any] = {}
    for key, value in _flatten(table).items():
        checked = _check_value(path, key, value)
        values[KEYS[LEGACY_KEYS.get(key, key)]] = checked
    return values


def settings_from_toml(path: Path, text: str) -> Settings:
    """Parse and validate the text of a config file (pure; ``path`` only names it)."""
    hint = "fix it by hand, or run `lucebox config reset` to keep it aside and start over"
    return Settings(**_checked_fields(path, text, hint))


SETTINGS_ENV = "LUCEBOX_SETTINGS"
"""TOML (``spec.calibrate_idle_s = 2``) layered over config.toml by :func:`load_settings`."""


def layered(settings: Settings, text: str) -> Settings:
    """``settings`` with the keys the TOML ``text`` of :data:`SETTINGS_ENV` sets (pure)."""
    hint = f"write {SETTINGS_ENV} as TOML, e.g. {SETTINGS_ENV}='spec.calibrate_idle_s = 2'"
    return dataclasses.replace(settings, **_checked_fields(Path(f"${SETTINGS_ENV}"), text, hint))


def settings_to_toml(settings: Settings) -> str:
    """Render the settings that differ from the defaults as TOML, in sections."""
    defaults = Settings()
    table: dict[str, Any] = {}
    for key, field in KEYS.items():
        value = getattr(settings, field)
        if value == getattr(defaults, field):
            continue
        *sections, leaf = key.split(".")
        node = table
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return tomli_w.dumps(table)


def load_settings(paths: Paths, environ: Mapping[str, str] | None = None) -> Settings:
    """config.toml with what :data:`SETTINGS_ENV` of ``environ`` (default: this process's)
    layers over it."""
    settings = file_settings(paths)
    over = (os.environ if environ is None else environ).get(SETTINGS_ENV, "")
    return layered(settings, over) if over.strip() else settings


def file_settings(paths: Paths) -> Settings:
    """Read config.toml alone; a missing file means defaults."""
    path = paths.config_file
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Settings()
    except NotADirectoryError as exc:
        raise ConfigError(
            f"{paths.config_dir} is not a folder, so {path.name} cannot live there",
            hint="move that file away or point LUCEBOX_HOME elsewhere",
        ) from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{path} is a folder, not a file", hint="move it away") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text",
            hint="run `lucebox config reset` to keep it aside and start over",
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    settings = settings_from_toml(path, text)
    if any(key in _flatten(tomllib.loads(text)) for key in LEGACY_KEYS):
        save_settings(paths, settings)  # rewrite old keys under their new names
    return settings


SPEC_MODES = ("", "auto", "off", "mtp", "dflash", "draft", "ngram")
"""What ``model.spec`` takes (empty is auto); the planner's speculation modes."""
VISION_SETTINGS = ("", "auto", "on", "off")
"""What ``model.vision`` takes (empty is auto)."""


def _origin(key: str, text: str) -> str:
    """A web origin as browsers send it (scheme, host, port; lower case), or ``*``."""
    if text == "*":
        return text
    parts = urlsplit(text.lower())
    try:
        port = parts.port
    except ValueError:
        port = None
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise ConfigError(
            f"{key} takes web origins, not {text!r}",
            hint="write each as SCHEME://HOST[:PORT] (http://192.168.1.20:3000), or * for any",
        )
    default_port = {"http": 80, "https": 443}[parts.scheme]
    shown_port = f":{port}" if port and port != default_port else ""  # as browsers send it
    return f"{parts.scheme}://{parts.hostname}{shown_port}"


def parse_value(key: str, raw: str) -> Any:
    """Turn the text a user typed for ``key`` into a value of the key's type."""
    if key == "model.spec" and raw not in SPEC_MODES:
        raise ConfigError(f"key 'model.spec' takes one of {', '.join(SPEC_MODES[1:])}, not {raw!r}")
    if key == "model.vision" and raw not in VISION_SETTINGS:
        raise ConfigError(
            f"key 'model.vision' takes one of {', '.join(VISION_SETTINGS[1:])}, not {raw!r}"
        )
    if key == "server.port" and raw.strip().isdigit() and not 1 <= int(raw) <= 65535:
        raise ConfigError(f"key 'server.port' takes a port from 1 to 65535, not {raw}")
    if key == "server.users" and raw.strip().isdigit() and int(raw) < 1:
        raise ConfigError("key 'server.users' takes a number of people, 1 or more, not 0")
    field = KEYS.get(key)
    if field is None:
        raise ConfigError(f"unknown key '{key}'", hint=f"known keys: {', '.join(KEYS)}")
    kind = _FIELD_TYPES[field]
    if field in _STRING_LISTS:
        items = tuple(item.strip() for item in raw.split(",") if item.strip())
        for item in items if field == "rpc_peers" else ():
            try:
                split_address(item)
            except UsageError as exc:
                raise ConfigError(f"key '{key}': {exc.message}", hint=exc.hint) from exc
        if field == "allowed_origins":
            return tuple(_origin(f"key '{key}'", item) for item in items)
        return items
    if kind is tuple:
        try:
            indices = tuple(int(item) for item in raw.split(",") if item.strip())
        except ValueError as exc:
            raise ConfigError(f"key '{key}' takes integers like 0,1, not {raw!r}") from exc
        if any(i < 0 for i in indices):
            raise ConfigError(f"key '{key}' takes non-negative integers, not {raw!r}")
        return indices
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in {"true", "yes", "on", "1"}:
            return True
        if lowered in {"false", "no", "off", "0"}:
            return False
        raise ConfigError(f"key '{key}' takes true or false, not {raw!r}")
    if kind is int:
        try:
            value = int(raw)
        except ValueError as exc:
            raise ConfigError(f"key '{key}' takes an integer, not {raw!r}") from exc
        if value < 0:
            raise ConfigError(f"key '{key}' must not be negative, not {value}")
        return value
    if kind is float:
        try:
            number = float(raw)
        except ValueError as exc:
            raise ConfigError(f"key '{key}' takes a number, not {raw!r}") from exc
        if not number >= 0:
            raise ConfigError(f"key '{key}' must be a number not below 0, not {raw}")
        return number
    return raw


def save_settings(paths: Paths, settings: Settings) -> Path:
    """Write config.toml atomically; the old file stays whole if anything fails.

    The file is created with mode 0600 (as every atomic write is), since it may hold
    ``server.api_key``.
    """
    path = paths.config_file
    try:
        paths.ensure(paths.config_dir)
        write_text_atomic(path, settings_to_toml(settings))
    except PathsError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from exc
    except OSError as exc:
        raise ConfigError(
            f"cannot write {path}: {exc.strerror or exc}",
            hint="check the folder's permissions or point LUCEBOX_HOME elsewhere",
        ) from exc
    return path


def set_setting(paths: Paths, key: str, raw: str) -> Settings:
    """Change one key; a config file that does not validate is refused, never overwritten."""
    value = parse_value(key, raw)
    updated = dataclasses.replace(file_settings(paths), **{KEYS[key]: value})
    save_settings(paths, updated)
    return updated


def reset_config(paths: Paths, now_s: float | None = None) -> Path | None:
    """Keep the current config.toml as ``config.toml.bad-<timestamp>`` and write defaults.

    Returns where the old file was kept, or None when there was none.
    """
    path = paths.config_file
    kept: Path | None = None
    if path.exists():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now_s))
        kept = path.with_name(f"{path.name}.bad-{stamp}")
        try:
            path.rename(kept)
        except OSError as exc:
            raise ConfigError(f"cannot move {path} aside: {exc.strerror or exc}") from exc
    save_settings(paths, Settings())
    return kept
