# Sourced by the bench/device_*.sh scripts: the wheels carried in .whl/ installed into /tmp/site,
# the sources seen as the lucebox package, and LUCEBOX_HOME in .devrun/ (kept while the machine
# stays warm, so a second script finds the engine the first one built).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
mkdir -p .typecheck/lucebox .devrun/work
for part in app engine presets; do ln -sfn "../../$part" ".typecheck/lucebox/$part"; done
export PYTHONPATH=/tmp/site:$PWD/.typecheck:$PWD PYTHONUNBUFFERED=1 LUCEBOX_HOME=$PWD/.devrun/home
lucebox() { python3 -m lucebox.app.cli "$@"; }
