"""``lucebox connect CLIENT``: the settings that point a coding agent or SDK at this server.

For each client: the base URL, the model alias, the API key when the server has one, and the
settings that keep the engine's prompt cache warm. Printed as shell exports and a config
snippet, or merged into the client's own config file (the old file kept as a backup, the new
one written atomically). Where each format comes from is cited at its client.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomli_w

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import ConfigError, UsageError

CLIENTS = ("claude-code", "opencode", "codex", "aider", "openai", "anthropic")
PROVIDER_ID = "lucebox"
KEY_ENV = "LUCEBOX_API_KEY"


@dataclass(frozen=True)
class Endpoint:
    url: str
    """The server root, e.g. ``http://127.0.0.1:8080`` (no ``/v1``)."""
    model: str
    api_key: str | None = None
    aliases: tuple[str, ...] = ()
    """Every model of a served set (``model`` is the one the client starts with)."""


@dataclass(frozen=True)
class ClientSetup:
    client: str
    env: tuple[tuple[str, str], ...]
    """Shell variables the client reads (printed as ``export`` lines)."""
    config_path: Path | None
    """The client's config file, or None where it reads only the environment."""
    merge: Callable[[str | None], str] | None
    """Existing file text (None when absent) -> the text with our settings merged in."""
    notes: tuple[str, ...] = ()


def _load_json_object(text: str | None, path: Path) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"{path} is not valid JSON ({exc}); lucebox will not rewrite it",
            hint="fix it or move it away, then run `lucebox connect` again",
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} does not hold a JSON object; lucebox will not rewrite it")
    return value


def _table(settings: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    """``settings[key]`` as a table to merge into (empty when absent)."""
    value = settings.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{path}: `{key}` is not a table/object; lucebox will not rewrite it",
            hint=f"fix `{key}` or move the file away, then run `lucebox connect` again",
        )
    return value


def _claude_code(endpoint: Endpoint, home: Path) -> ClientSetup:
    # Claude Code applies the `env` object of ~/.claude/settings.json on every start
    # (docs.cloudbase.net/en/ai/ai-tools/claude-code; the variables: code.claude.com/docs/en/
    # env-vars). Its attribution header changes the prompt on every request and so defeats
    # prefix caching; it turns off only from settings.json, not the shell
    # (unsloth.ai/docs/basics/api/claude-code, agentpatterns.ai/context-engineering/
    # kv-cache-invalidation-local-inference).
    path = home / ".claude" / "settings.json"
    env = {
        "ANTHROPIC_BASE_URL": endpoint.url,
        "ANTHROPIC_MODEL": endpoint.model,
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if endpoint.api_key:
        env["ANTHROPIC_AUTH_TOKEN"] = endpoint.api_key

    def merge(text: str | None) -> str:
        settings = _load_json_object(text, path)
        settings["env"] = {**_table(settings, "env", path), **env}
        return json.dumps(settings, indent=2) + "\n"

    return ClientSetup(
        "claude-code",
        tuple(env.items()),
        path,
        merge,
        ("the attribution header only turns off from settings.json: use --write",),
    )


def _opencode(endpoint: Endpoint, home: Path) -> ClientSetup:
    # A custom OpenAI-compatible provider in ~/.config/opencode/opencode.json: `provider.<id>`
    # with `npm: @ai-sdk/openai-compatible`, `options.baseURL`/`apiKey` and `models`
    # (github.com/en4ble1337/opencode-with-local-ollama), and the default `model` as
    # provider_id/model_id (opencode's docs, packages/web/src/content/docs/models.mdx).
    path = home / ".config" / "opencode" / "opencode.json"
    options = {"baseURL": f"{endpoint.url}/v1"}
    if endpoint.api_key:
        options["apiKey"] = endpoint.api_key
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "lucebox (local)",
        "options": options,
        "models": {alias: {"name": alias} for alias in endpoint.aliases or (endpoint.model,)},
    }

    def merge(text: str | None) -> str:
        settings = _load_json_object(text, path)
        settings.setdefault("$schema", "https://opencode.ai/config.json")
        settings["provider"] = {**_table(settings, "provider", path), PROVIDER_ID: provider}
        settings["model"] = f"{PROVIDER_ID}/{endpoint.model}"
        return json.dumps(settings, indent=2) + "\n"

    return ClientSetup("opencode", (), path, merge)


def _codex(endpoint: Endpoint, home: Path) -> ClientSetup:
    # ~/.codex/config.toml: `model`, `model_provider`, and `[model_providers.<id>]` with
    # `base_url` (ending in /v1), `wire_api = "responses"` (Codex calls /v1/responses; newer
    # releases accept nothing else) and `env_key` naming the variable that holds the key
    # (developers.openai.com/codex/config-sample; dev.to/aihubmix/codex-configtoml-a-working-
    # setup-and-what-each-error-means-2ghj).
    path = home / ".codex" / "config.toml"
    provider: dict[str, Any] = {
        "name": "lucebox (local)",
        "base_url": f"{endpoint.url}/v1",
        "wire_api": "responses",
    }
    env: tuple[tuple[str, str], ...] = ()
    if endpoint.api_key:
        provider["env_key"] = KEY_ENV
        env = ((KEY_ENV, endpoint.api_key),)

    def merge(text: str | None) -> str:
        try:
            settings = tomllib.loads(text or "")
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"{path} is not valid TOML ({exc}); lucebox will not rewrite it",
                hint="fix it or move it away, then run `lucebox connect` again",
            ) from None
        settings["model"] = endpoint.model
        settings["model_provider"] = PROVIDER_ID
        settings["model_providers"] = {
            **_table(settings, "model_providers", path),
            PROVIDER_ID: provider,
        }
        return tomli_w.dumps(settings)

    return ClientSetup(
        "codex", env, path, merge, ("--write does not keep comments; the backup has them",)
    )


_AIDER_KEY = re.compile(r"^([A-Za-z0-9_-]+)\s*:")


def _aider(endpoint: Endpoint, home: Path) -> ClientSetup:
    # ~/.aider.conf.yml takes the command line options as top-level keys: `openai-api-base`,
    # `openai-api-key`, and `model` with the `openai/` prefix for an OpenAI-compatible server
    # (aider.chat/docs/llms/openai-compat.html; docs.cloudbase.net/en/ai/ai-tools/aider).
    path = home / ".aider.conf.yml"
    values = {"openai-api-base": f"{endpoint.url}/v1", "model": f"openai/{endpoint.model}"}
    if endpoint.api_key:
        values["openai-api-key"] = endpoint.api_key

    def merge(text: str | None) -> str:
        # The file is flat `key: value` lines: replace our keys' lines, keep every other line.
        kept = []
        for line in (text or "").splitlines():
            match = _AIDER_KEY.match(line)
            if match is None or match.group(1) not in values:
                kept.append(line)
        kept += [f"{key}: {json.dumps(value)}" for key, value in values.items()]
        return "\n".join(kept) + "\n"

    return ClientSetup("aider", (), path, merge)


def _openai(endpoint: Endpoint, home: Path) -> ClientSetup:
    # The official SDKs read OPENAI_BASE_URL / OPENAI_API_KEY (github.com/openai/openai-python).
    env = [("OPENAI_BASE_URL", f"{endpoint.url}/v1")]
    if endpoint.api_key:
        env.append(("OPENAI_API_KEY", endpoint.api_key))
    return ClientSetup("openai", tuple(env), None, None, (f"model: {endpoint.model}",))


def _anthropic(endpoint: Endpoint, home: Path) -> ClientSetup:
    # ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY (github.com/anthropics/anthropic-sdk-python);
    # the server answers the Messages API at /v1/messages.
    env = [("ANTHROPIC_BASE_URL", endpoint.url)]
    if endpoint.api_key:
        env.append(("ANTHROPIC_API_KEY", endpoint.api_key))
    return ClientSetup("anthropic", tuple(env), None, None, (f"model: {endpoint.model}",))


_SETUPS: dict[str, Callable[[Endpoint, Path], ClientSetup]] = {
    "claude-code": _claude_code,
    "opencode": _opencode,
    "codex": _codex,
    "aider": _aider,
    "openai": _openai,
    "anthropic": _anthropic,
}


def setup_for(client: str, endpoint: Endpoint, home: Path) -> ClientSetup:
    if client not in _SETUPS:
        raise UsageError(f"unknown client {client!r}", hint=f"one of {', '.join(CLIENTS)}")
    setup = _SETUPS[client](endpoint, home)
    others = [alias for alias in endpoint.aliases if alias != endpoint.model]
    if not others:
        return setup
    note = f"the server also serves {', '.join(others)}: name one as the model to switch"
    return replace(setup, notes=(*setup.notes, note))


def _backup_path(path: Path) -> Path:
    """A backup name no earlier backup holds, so no write ever replaces the original's copy."""
    stem = f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, number = path.with_name(stem), 1
    while candidate.exists():
        candidate, number = path.with_name(f"{stem}-{number}"), number + 1
    return candidate


def write_setup(setup: ClientSetup) -> tuple[Path, Path | None]:
    """Merge into the client's config file; returns it and the backup of the old one."""
    if setup.config_path is None or setup.merge is None:
        raise UsageError(
            f"{setup.client} has no config file: it reads environment variables",
            hint="put the printed export lines in your shell profile",
        )
    path = setup.config_path
    try:
        old = path.read_text("utf-8") if path.exists() else None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    new = setup.merge(old)
    backup = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if old is not None:
            backup = _backup_path(path)
            write_text_atomic(backup, old)
        write_text_atomic(path, new)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    return path, backup
