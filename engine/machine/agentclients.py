"""What each coding agent and SDK needs to send its first request to this server.

One builder per client: its own variables, the files it reads (and how lucebox merges into
them), and how ``lucebox launch`` runs it with the least change to the user's files. Where each
format comes from is cited at its builder; each was checked against the real client (the
versions support/agentinstall.py installs) by ``tests/e2e/test_agent_clients.py``.

One builder per client, kept together so ``CLIENTS`` and the builders cannot drift.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomli_w

from lucebox.engine.core.errors import ConfigError
from lucebox.engine.machine.connect import (
    KEY_ENV,
    PROVIDER_ID,
    ClientSetup,
    ConfigFile,
    Endpoint,
    EnvVar,
    dump_json,
    load_json_object,
    table,
)

CLIENTS = (
    "claude-code",
    "codex",
    "opencode",
    "aider",
    "llm",
    "qwen-code",
    "continue",
    "openai",
    "anthropic",
)
PROGRAMS = {
    "claude-code": "claude",
    "codex": "codex",
    "opencode": "opencode",
    "aider": "aider",
    "llm": "llm",
    "qwen-code": "qwen",
    "continue": "cn",
}
"""The command each client that is a program runs as (the SDKs have none)."""


@dataclass(frozen=True)
class Where:
    """Where clients keep their files, and where lucebox keeps the ones it owns."""

    home: Path
    own_dir: Path
    """lucebox's folder for configs it points a launched client at."""
    llm_dir: Path
    """llm's user folder (``LLM_USER_PATH``, else ``~/.config/io.datasette.llm``)."""


def _claude_code(endpoint: Endpoint, where: Where) -> ClientSetup:
    # Claude Code applies the `env` object of ~/.claude/settings.json on every start, and
    # `--settings JSON` adds settings for one run (code.claude.com/docs/en/settings; variables:
    # code.claude.com/docs/en/env-vars). It sends nothing until a token is set. The
    # attribution header changes the prompt on every request and so defeats prefix caching;
    # it turns off only from settings (unsloth.ai/docs/basics/api/claude-code).
    env = [
        EnvVar("ANTHROPIC_BASE_URL", endpoint.url),
        EnvVar("ANTHROPIC_AUTH_TOKEN", endpoint.client_key, secret=endpoint.api_key is not None),
        EnvVar("ANTHROPIC_MODEL", endpoint.model),
        EnvVar("ANTHROPIC_DEFAULT_HAIKU_MODEL", endpoint.model),
        EnvVar("CLAUDE_CODE_ATTRIBUTION_HEADER", "0"),
        EnvVar("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ]
    # No window variable: CLAUDE_CODE_AUTO_COMPACT_WINDOW reads anything under 100K as 100K.
    if endpoint.output_tokens is not None:
        env.append(EnvVar("CLAUDE_CODE_MAX_OUTPUT_TOKENS", str(endpoint.output_tokens)))
    values = {var.name: var.value for var in env}
    path = where.home / ".claude" / "settings.json"

    def merge(text: str | None) -> str:
        settings = load_json_object(text, path)
        settings["env"] = {**table(settings, "env", path), **values}
        return dump_json(settings)

    return ClientSetup(
        "claude-code",
        tuple(env),
        (ConfigFile(path, merge),),
        program=PROGRAMS["claude-code"],
        launch_env=tuple(env),
        launch_args=("--settings", json.dumps({"env": values})),
    )


def _codex_provider(endpoint: Endpoint, *, in_file: bool) -> dict[str, Any]:
    provider: dict[str, Any] = {
        "name": "lucebox (local)",
        "base_url": f"{endpoint.url}/v1",
        "wire_api": "responses",
    }
    if endpoint.api_key and in_file:
        provider["experimental_bearer_token"] = endpoint.api_key
    elif endpoint.api_key:
        provider["env_key"] = KEY_ENV
    return provider


def _codex(endpoint: Endpoint, where: Where) -> ClientSetup:
    # ~/.codex/config.toml: `model`, `model_provider`, `model_context_window` and
    # `[model_providers.<id>]` with `base_url` (ending in /v1), `wire_api = "responses"` (the
    # only one newer releases accept) and the key from `env_key`'s variable or
    # `experimental_bearer_token`; `codex -c KEY=VALUE` sets any of them for one run
    # (developers.openai.com/codex/config-reference). Without a key field Codex sends none.
    path = where.home / ".codex" / "config.toml"
    top: dict[str, Any] = {"model": endpoint.model, "model_provider": PROVIDER_ID}
    if endpoint.ctx is not None:
        top["model_context_window"] = endpoint.ctx

    def merge(text: str | None) -> str:
        try:
            settings = tomllib.loads(text or "")
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"{path} is not valid TOML ({exc}); lucebox will not rewrite it",
                hint="fix it or move it away, then run `lucebox connect` again",
            ) from None
        settings.update(top)
        providers = table(settings, "model_providers", path)
        settings["model_providers"] = {
            **providers,
            PROVIDER_ID: _codex_provider(endpoint, in_file=True),
        }
        return tomli_w.dumps(settings)

    overrides = {**top, f"model_providers.{PROVIDER_ID}": _codex_provider(endpoint, in_file=False)}
    args: list[str] = []
    for key, value in overrides.items():
        args += ["-c", f"{key}={_toml_inline(value)}"]
    key_env = (EnvVar(KEY_ENV, endpoint.client_key, secret=True),) if endpoint.api_key else ()
    return ClientSetup(
        "codex",
        (),
        (ConfigFile(path, merge, keeps_comments=False),),
        program=PROGRAMS["codex"],
        launch_env=key_env,
        launch_args=tuple(args),
    )


def _toml_inline(value: Any) -> str:
    """``value`` as a TOML inline value (what ``codex -c`` parses)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_inline(v)}" for k, v in value.items()) + "}"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _opencode_config(endpoint: Endpoint, key_file: Path | None) -> dict[str, Any]:
    # A custom provider: `npm: @ai-sdk/openai-compatible`, `options.baseURL`/`apiKey`, and
    # `models.<id>.limit.{context,output}`; `{file:PATH}` reads a value from a file
    # (opencode.ai/docs/providers, opencode.ai/docs/config#variables).
    api_key = f"{{file:{key_file}}}" if key_file is not None else endpoint.client_key
    model: dict[str, Any] = {"name": endpoint.model}
    if endpoint.ctx is not None:
        model["limit"] = {"context": endpoint.ctx, "output": endpoint.output_tokens}
    return {
        "npm": "@ai-sdk/openai-compatible",
        "name": "lucebox (local)",
        "options": {"baseURL": f"{endpoint.url}/v1", "apiKey": api_key},
        "models": {
            alias: {**model, "name": alias} for alias in endpoint.aliases or (endpoint.model,)
        },
    }


def _opencode(endpoint: Endpoint, where: Where) -> ClientSetup:
    # ~/.config/opencode/opencode.json, or for one run OPENCODE_CONFIG_CONTENT (inline JSON
    # merged over the files); `model` is provider_id/model_id (opencode.ai/docs/config).
    path = where.home / ".config" / "opencode" / "opencode.json"
    key_file = endpoint.api_key_file if endpoint.api_key else None
    provider = _opencode_config(endpoint, key_file)
    model = f"{PROVIDER_ID}/{endpoint.model}"

    def merge(text: str | None) -> str:
        settings = load_json_object(text, path)
        settings.setdefault("$schema", "https://opencode.ai/config.json")
        settings["provider"] = {**table(settings, "provider", path), PROVIDER_ID: provider}
        settings["model"] = model
        return dump_json(settings)

    inline = json.dumps({"provider": {PROVIDER_ID: provider}, "model": model})
    return ClientSetup(
        "opencode",
        (),
        (ConfigFile(path, merge),),
        program=PROGRAMS["opencode"],
        launch_env=(EnvVar("OPENCODE_CONFIG_CONTENT", inline),),
    )


_YAML_KEY = re.compile(r"^([A-Za-z0-9_-]+)\s*:")


def _aider_metadata(endpoint: Endpoint) -> dict[str, Any]:
    # litellm's model table entry; aider reads extra entries from ~/.aider.model.metadata.json
    # or --model-metadata-file (aider.chat/docs/config/adv-model-settings.html).
    return {
        "max_tokens": endpoint.output_tokens,
        "max_input_tokens": endpoint.ctx,
        "max_output_tokens": endpoint.output_tokens,
        "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0,
        "litellm_provider": "openai",
        "mode": "chat",
    }


def _aider(endpoint: Endpoint, where: Where) -> ClientSetup:
    # ~/.aider.conf.yml takes the command line options as top-level keys; litellm refuses to
    # send without `openai-api-key`; `openai/` routes the model to OPENAI_API_BASE
    # (aider.chat/docs/llms/openai-compat.html). Each option also reads AIDER_<OPTION>.
    conf = where.home / ".aider.conf.yml"
    metadata = where.home / ".aider.model.metadata.json"
    model = f"openai/{endpoint.model}"
    values = {
        "openai-api-base": f"{endpoint.url}/v1",
        "openai-api-key": endpoint.client_key,
        "model": model,
    }

    def merge_conf(text: str | None) -> str:
        # Flat `key: value` lines: replace our keys' lines, keep every other line.
        kept = [
            line
            for line in (text or "").splitlines()
            if (match := _YAML_KEY.match(line)) is None or match.group(1) not in values
        ]
        kept += [f"{key}: {json.dumps(value)}" for key, value in values.items()]
        return "\n".join(kept) + "\n"

    def merge_metadata(text: str | None) -> str:
        return dump_json({**load_json_object(text, metadata), model: _aider_metadata(endpoint)})

    files = [ConfigFile(conf, merge_conf)]
    launch_env = [
        EnvVar("OPENAI_API_BASE", values["openai-api-base"]),
        EnvVar("OPENAI_API_KEY", endpoint.client_key, secret=endpoint.api_key is not None),
        EnvVar("AIDER_MODEL", model),
    ]
    own: tuple[tuple[Path, str], ...] = ()
    if endpoint.ctx is not None:
        files.append(ConfigFile(metadata, merge_metadata))
        own_metadata = where.own_dir / "aider.model.metadata.json"
        own = ((own_metadata, dump_json({model: _aider_metadata(endpoint)})),)
        launch_env.append(EnvVar("AIDER_MODEL_METADATA_FILE", str(own_metadata)))
    return ClientSetup(
        "aider",
        (),
        tuple(files),
        program=PROGRAMS["aider"],
        launch_env=tuple(launch_env),
        own_files=own,
    )


BLOCK_BEGIN = "# lucebox: begin (`lucebox connect llm --restore` removes it)"
BLOCK_END = "# lucebox: end"


def _replace_block(text: str | None, block: str) -> str:
    """``text`` with lucebox's marked block replaced by ``block`` (appended when absent)."""
    lines = (text or "").splitlines()
    if BLOCK_BEGIN in lines and BLOCK_END in lines[lines.index(BLOCK_BEGIN) :]:
        start = lines.index(BLOCK_BEGIN)
        end = lines.index(BLOCK_END, start)
        lines = lines[:start] + lines[end + 1 :]
    return "\n".join([*lines, BLOCK_BEGIN, block, BLOCK_END]) + "\n"


def _llm(endpoint: Endpoint, where: Where) -> ClientSetup:
    # llm's extra-openai-models.yaml: a list of `model_id`, `model_name`, `api_base`; with an
    # `api_base` and no `api_key_name` llm sends a dummy key, else it reads that name from
    # keys.json (llm.datasette.io/en/stable/other-models.html#openai-compatible-models).
    # llm reads no variable for the address, so launch writes this file too.
    models = where.llm_dir / "extra-openai-models.yaml"
    keys = where.llm_dir / "keys.json"
    entry = [
        f"- model_id: {json.dumps(endpoint.model)}",
        f"  model_name: {json.dumps(endpoint.model)}",
        f"  api_base: {json.dumps(endpoint.url + '/v1')}",
    ]
    if endpoint.api_key:
        entry.append(f"  api_key_name: {PROVIDER_ID}")

    def merge_models(text: str | None) -> str:
        stripped = [line for line in (text or "").splitlines() if line.strip()]
        if stripped and not any(line.startswith("- ") for line in stripped):
            raise ConfigError(
                f"{models} does not hold a YAML list; lucebox will not rewrite it",
                hint="fix it or move it away, then run `lucebox connect llm` again",
            )
        return _replace_block(text, "\n".join(entry))

    def merge_keys(text: str | None) -> str:
        return dump_json({**load_json_object(text, keys), PROVIDER_ID: endpoint.client_key})

    files = [ConfigFile(models, merge_models)]
    if endpoint.api_key:
        files.append(ConfigFile(keys, merge_keys))
    notes = [f"use it with `llm -m {endpoint.model} PROMPT`"]
    embed_env: tuple[EnvVar, ...] = ()
    if endpoint.embed_model:
        # llm's OpenAI embedding models have no address of their own in its files; their
        # OpenAI client reads the SDK's variables, and lucebox answers any model name there
        # with the one embedding model it serves.
        embed_env = _openai_env(endpoint)
        notes.append(
            f"embed with `lucebox launch llm -- embed -m 3-small -c TEXT` ({endpoint.embed_model})"
        )
    return ClientSetup(
        "llm",
        (),
        tuple(files),
        program=PROGRAMS["llm"],
        launch_files=tuple(files),
        launch_env=embed_env,
        notes=tuple(notes),
    )


def _qwen_code(endpoint: Endpoint, where: Where) -> ClientSetup:
    # Qwen Code takes OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL from the environment,
    # and in ~/.qwen/settings.json `security.auth.selectedType`, `model.name`, `env`, and
    # `modelProviders.openai[]` with `baseUrl`, `envKey` and `generationConfig.
    # contextWindowSize` (qwenlm.github.io/qwen-code-docs/en/users/configuration/).
    path = where.home / ".qwen" / "settings.json"
    env = (
        EnvVar("OPENAI_BASE_URL", f"{endpoint.url}/v1"),
        EnvVar("OPENAI_API_KEY", endpoint.client_key, secret=endpoint.api_key is not None),
        EnvVar("OPENAI_MODEL", endpoint.model),
    )
    generation: dict[str, Any] = {}
    if endpoint.ctx is not None:
        generation = {
            "contextWindowSize": endpoint.ctx,
            "samplingParams": {"max_tokens": endpoint.output_tokens},
        }
    provider = {
        "id": endpoint.model,
        "name": f"{endpoint.model} (lucebox)",
        "baseUrl": f"{endpoint.url}/v1",
        "envKey": KEY_ENV,
        **({"generationConfig": generation} if generation else {}),
    }

    def merge(text: str | None) -> str:
        settings = load_json_object(text, path)
        security = table(settings, "security", path)
        auth = table(security, "auth", path)
        settings["security"] = {**security, "auth": {**auth, "selectedType": "openai"}}
        settings["model"] = {**table(settings, "model", path), "name": endpoint.model}
        providers = table(settings, "modelProviders", path)
        others = [
            p
            for p in providers.get("openai", [])
            if not isinstance(p, dict) or p.get("envKey") != KEY_ENV
        ]
        settings["modelProviders"] = {**providers, "openai": [provider, *others]}
        settings["env"] = {**table(settings, "env", path), KEY_ENV: endpoint.client_key}
        return dump_json(settings)

    return ClientSetup(
        "qwen-code", env, (ConfigFile(path, merge),), program=PROGRAMS["qwen-code"], launch_env=env
    )


def _continue_config(endpoint: Endpoint) -> str:
    # Continue's config.yaml (docs.continue.dev/reference): `models[]` with `provider: openai`,
    # `apiBase`, `apiKey`, `roles` and `defaultCompletionOptions.{contextLength,maxTokens}`.
    lines = [
        "name: lucebox",
        "version: 1.0.0",
        "schema: v1",
        "models:",
        f"  - name: {json.dumps(endpoint.model)}",
        "    provider: openai",
        f"    model: {json.dumps(endpoint.model)}",
        f"    apiBase: {json.dumps(endpoint.url + '/v1')}",
        f"    apiKey: {json.dumps(endpoint.client_key)}",
        "    roles: [chat, edit, apply]",
    ]
    if endpoint.ctx is not None:
        lines += [
            "    defaultCompletionOptions:",
            f"      contextLength: {endpoint.ctx}",
            f"      maxTokens: {endpoint.output_tokens}",
        ]
    if endpoint.embed_model:
        lines += [
            f"  - name: {json.dumps(endpoint.embed_model)}",
            "    provider: openai",
            f"    model: {json.dumps(endpoint.embed_model)}",
            f"    apiBase: {json.dumps(endpoint.url + '/v1')}",
            f"    apiKey: {json.dumps(endpoint.client_key)}",
            "    roles: [embed]",
        ]
    return "\n".join(lines) + "\n"


def _continue(endpoint: Endpoint, where: Where) -> ClientSetup:
    # The `cn` CLI reads ~/.continue/config.yaml, or the file `--config` names.
    path = where.home / ".continue" / "config.yaml"
    text = _continue_config(endpoint)

    def merge(old: str | None) -> str:
        if old is not None and old.strip() and not old.startswith("name: lucebox\n"):
            raise ConfigError(
                f"{path} holds your own Continue config; lucebox will not rewrite it",
                hint="use `lucebox launch continue` (it leaves the file alone), or move it away",
            )
        return text

    own = where.own_dir / "continue.yaml"
    return ClientSetup(
        "continue",
        (),
        (ConfigFile(path, merge),),
        program=PROGRAMS["continue"],
        launch_args=("--config", str(own)),
        own_files=((own, text),),
    )


def _openai(endpoint: Endpoint, where: Where) -> ClientSetup:
    # The official SDKs read OPENAI_BASE_URL / OPENAI_API_KEY and refuse to start without a
    # key (github.com/openai/openai-python).
    notes = [f"model: {endpoint.model}"]
    if endpoint.embed_model:
        notes.append(f"embedding model: {endpoint.embed_model} (/v1/embeddings)")
    return ClientSetup("openai", _openai_env(endpoint), (), notes=tuple(notes))


def _openai_env(endpoint: Endpoint) -> tuple[EnvVar, ...]:
    return (
        EnvVar("OPENAI_BASE_URL", f"{endpoint.url}/v1"),
        EnvVar("OPENAI_API_KEY", endpoint.client_key, secret=endpoint.api_key is not None),
    )


def _anthropic(endpoint: Endpoint, where: Where) -> ClientSetup:
    # ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY (github.com/anthropics/anthropic-sdk-python);
    # the server answers the Messages API at /v1/messages.
    env = (
        EnvVar("ANTHROPIC_BASE_URL", endpoint.url),
        EnvVar("ANTHROPIC_API_KEY", endpoint.client_key, secret=endpoint.api_key is not None),
    )
    return ClientSetup("anthropic", env, (), notes=(f"model: {endpoint.model}",))


_SETUPS: dict[str, Callable[[Endpoint, Where], ClientSetup]] = {
    "claude-code": _claude_code,
    "codex": _codex,
    "opencode": _opencode,
    "aider": _aider,
    "llm": _llm,
    "qwen-code": _qwen_code,
    "continue": _continue,
    "openai": _openai,
    "anthropic": _anthropic,
}


def setup_for(client: str, endpoint: Endpoint, where: Where) -> ClientSetup:
    """``client``'s setup; ``client`` is one of :data:`CLIENTS` (``known_client`` checks)."""
    setup = _SETUPS[client](endpoint, where)
    others = [alias for alias in endpoint.aliases if alias != endpoint.model]
    if not others:
        return setup
    note = f"the server also serves {', '.join(others)}: name one as the model to switch"
    return replace(setup, notes=(*setup.notes, note))
