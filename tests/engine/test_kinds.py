"""Each engine kind is one object: found by name, and each says how to get it built."""

from __future__ import annotations

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import kinds
from lucebox.engine.machine.gpu import probe_gpus

from .fake_nvml import FakeGpu, FakeNvml
from .test_cputarget import XEON_AMX


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
