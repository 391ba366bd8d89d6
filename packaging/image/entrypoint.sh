#!/usr/bin/env bash
# Entry point of the lucebox image: `lucebox serve`, configured by environment variables.
#
#   LUCEBOX_HOME          models, config.toml and the API key file: a volume (/data in the image)
#   LUCEBOX_PRESET        preset id (default: the best set that fits the GPU)
#   LUCEBOX_MODEL         a model source instead of a preset: hf:..., pypi:... or a path
#   LUCEBOX_CTX           context length in tokens (default: the largest that fits)
#   LUCEBOX_HOST          address inside the container (default 0.0.0.0, which needs an API key:
#                         lucebox writes one to $LUCEBOX_HOME/config/api_key and shows it once)
#   LUCEBOX_PORT          port inside the container (default 8080)
#   LUCEBOX_GPU           GPU index (default: every GPU; one alone when the model fits it)
#   LUCEBOX_ALLOW_BASE    true to serve a base (non-instruct) model
#   LUCEBOX_ENGINE        a llama-server built into the image, registered on the first start
#   LUCEBOX_ENGINE_SOURCE its llama.cpp source folder (for the model architectures it knows)
#
# No arguments: serve. Arguments starting with "-": more `serve` flags. Anything else is run as
# a command (`docker compose run lucebox lucebox doctor`).
set -euo pipefail

lucebox="${LUCEBOX_BIN:-lucebox}"

die() {
    echo "lucebox-entrypoint: $*" >&2
    exit 2
}

if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi

if [ -n "${LUCEBOX_PRESET:-}" ] && [ -n "${LUCEBOX_MODEL:-}" ]; then
    die "set LUCEBOX_PRESET or LUCEBOX_MODEL, not both"
fi

args=(serve --host "${LUCEBOX_HOST:-0.0.0.0}" --port "${LUCEBOX_PORT:-8080}")
[ -n "${LUCEBOX_PRESET:-}" ] && args+=(--preset "$LUCEBOX_PRESET")
[ -n "${LUCEBOX_MODEL:-}" ] && args+=(--model "$LUCEBOX_MODEL")
[ -n "${LUCEBOX_CTX:-}" ] && args+=(--ctx "$LUCEBOX_CTX")
[ -n "${LUCEBOX_GPU:-}" ] && args+=(--gpu "$LUCEBOX_GPU")
case "${LUCEBOX_ALLOW_BASE:-false}" in
    1 | true | yes | on) args+=(--allow-base) ;;
    0 | false | no | off | "") ;;
    *) die "LUCEBOX_ALLOW_BASE=${LUCEBOX_ALLOW_BASE} is not true or false" ;;
esac

# The engine built into the image lives outside the volume: register it once per volume.
if [ -n "${LUCEBOX_ENGINE:-}" ] && ! "$lucebox" engine path >/dev/null 2>&1; then
    source_args=()
    if [ -n "${LUCEBOX_ENGINE_SOURCE:-}" ]; then
        source_args=(--source "$LUCEBOX_ENGINE_SOURCE")
    fi
    "$lucebox" engine add "$LUCEBOX_ENGINE" "${source_args[@]}" >&2
fi

echo "lucebox-entrypoint: $lucebox ${args[*]} $*" >&2
exec "$lucebox" "${args[@]}" "$@"
