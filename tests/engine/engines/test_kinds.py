"""Each engine kind is one object: found by name, and each says how to get it built."""

from __future__ import annotations

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import kinds
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.plan.planner import find_installs
from tests.engine.builds import llama_build, lucebox_build
from tests.engine.engines.test_cputarget import XEON_AMX
from tests.engine.fake_nvml import FakeGpu, FakeNvml


def test_every_kind_is_found_by_its_name():
    assert set(kinds.KINDS) == {"llama-server", "lucebox"}
    for name, kind in kinds.KINDS.items():
        assert kinds.kind(name) is kind and kind.name == name


def test_with_nothing_installed_each_kind_names_the_command_that_builds_it(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu()]))
    for kind in kinds.KINDS.values():
        selection = kind.select(paths, probe, cpu=XEON_AMX)
        assert selection.engine is None
        assert kind.build_command.split()[:3] == ["lucebox", "engine", "build"]
    assert kinds.LUCEBOX.build_command in kinds.LUCEBOX.select(paths, probe).reason


def test_the_lucebox_engine_serves_the_default_sources_build_unless_engine_id_names_another(
    tmp_path,
):
    """Two sources' builds side by side: the default source's serves, though the other was
    installed later; engine.id picks either; an id of llama-server's leaves both kinds' rules."""
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu()]))
    current = lucebox_build(paths, "4cf58a04", "2026-11-01T10:00:00")
    other = lucebox_build(paths, "62880e20", "2026-11-02T10:00:00")
    llama = llama_build(paths, "b11434", "2026-11-01T10:00:00")
    chosen = kinds.LUCEBOX.select(paths, probe, cpu=XEON_AMX)
    assert chosen.engine is not None and chosen.engine.id == current.id
    assert chosen.reason == "built from the default source 4cf58a04"

    def served(kind: kinds.EngineKind, wanted_id: str) -> str | None:
        engine = kind.select(paths, probe, wanted_id, XEON_AMX).engine
        return engine.id if engine is not None else None

    assert served(kinds.LUCEBOX, other.id) == other.id
    assert served(kinds.LUCEBOX, llama.id) == current.id
    assert served(kinds.LLAMA_SERVER, other.id) == llama.id
    # The plan of a Lucebox launch is made for the build that serves.
    assert find_installs(paths, probe).lucebox.id == current.id
    assert find_installs(paths, probe, other.id).lucebox.id == other.id


def test_without_the_default_sources_build_the_newest_lucebox_build_serves(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu()]))
    older = lucebox_build(paths, "62880e20", "2026-11-02T10:00:00")
    chosen = kinds.LUCEBOX.select(paths, probe, cpu=XEON_AMX)
    assert chosen.engine is not None and chosen.engine.id == older.id
    assert "none from the default source 4cf58a04" in chosen.reason
