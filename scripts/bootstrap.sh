# Sourced by ./lucebox and scripts/test: make .venv in the checkout and install lucebox into it.
# Needs only python3; reinstalls when pyproject.toml changes. Usage: bootstrap_venv [EXTRAS]
bootstrap_venv() {
    local extras="${1:-}"
    local root venv spec stamp
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="${LUCEBOX_VENV:-$root/.venv}"
    spec="$root"
    [ -n "$extras" ] && spec="$root[$extras]"
    local sum
    sum="$(cksum <"$root/pyproject.toml" | cut -d' ' -f1)"
    stamp="$venv/.lucebox-installed-$sum-${extras:-base}"
    # A venv set up with the dev tools also serves plain `./lucebox`: no reinstall between them.
    if [ -z "$extras" ] && [ -f "$venv/.lucebox-installed-$sum-dev" ]; then
        stamp="$venv/.lucebox-installed-$sum-dev"
    fi
    if [ ! -f "$stamp" ]; then
        echo "lucebox: setting up $venv (first run only)" >&2
        python3 -m venv "$venv" || { echo "lucebox: python3 -m venv failed; install python3-venv" >&2; return 1; }
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$spec" \
            || { echo "lucebox: installing dependencies into $venv failed (see above)" >&2; return 1; }
        rm -f "$venv"/.lucebox-installed-*
        touch "$stamp"
    fi
    VENV_BIN="$venv/bin"
}
