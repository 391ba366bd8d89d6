"""lucebox's folders of the Lucebox engine's disk prefix cache: kept by recency within the
budget, dropped with their model."""

from __future__ import annotations

import os
from pathlib import Path

from lucebox.engine.core import prefixstore
from lucebox.engine.core.prefixstore import PrefixKey


def saved(root: Path, model: Path, ctx: int, size: int, used_s: float) -> Path:
    """A folder as a start and the engine leave it: the record, one state of ``size`` bytes."""
    key = PrefixKey(str(model), 1, 1, "build", "q4_0", "q4_0", ctx)
    folder = root / key.folder_name
    prefixstore.prepare(folder, key)
    (folder / "layout").mkdir()
    (folder / "layout" / "a.dkv").write_bytes(bytes(size))
    for found in (folder, folder / "layout"):
        os.utime(found, (used_s, used_s))
    return folder


def test_other_folders_go_least_recently_used_first_until_the_store_fits(tmp_path):
    model = tmp_path / "m.gguf"
    oldest = saved(tmp_path, model, 1024, 4000, 1_000)
    newer = saved(tmp_path, model, 2048, 4000, 2_000)
    current = saved(tmp_path, model, 4096, 4000, 500)
    assert prefixstore.usage(current) == prefixstore.StoreUsage(1, 4000)
    removed = prefixstore.trim(tmp_path, current, 9_000)
    assert removed == [oldest]
    assert newer.is_dir() and current.is_dir()
    assert prefixstore.trim(tmp_path, current, 100) == [newer]
    assert current.is_dir(), "the launch's own folder is the engine's to evict in"


def test_removing_a_model_drops_its_folders_only(tmp_path):
    mine, other = tmp_path / "mine.gguf", tmp_path / "other.gguf"
    first = saved(tmp_path, mine, 1024, 10, 1)
    second = saved(tmp_path, mine, 2048, 10, 1)
    kept = saved(tmp_path, other, 1024, 10, 1)
    assert sorted(prefixstore.forget_model(tmp_path, mine)) == sorted([first, second])
    assert kept.is_dir() and not first.exists()
    assert prefixstore.usage(first) == prefixstore.StoreUsage(0, 0)


def test_models_rm_and_an_update_drop_the_models_folders(tmp_path):
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.models import records, revisions
    from lucebox.engine.models.records import ModelRecord, StoredFile

    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    root = paths.prefix_cache_dir

    def record(name: str, revision: str) -> ModelRecord:
        model = tmp_path / f"{name}-{revision}.gguf"
        model.write_bytes(b"GGUF")
        stored = StoredFile(str(model), 4, "0" * 64, owned=True)
        return ModelRecord(name, f"hf:a/{name}", "target", (stored,), "local", revision, "now")

    old, new, other = record("m", "r1"), record("m", "r2"), record("o", "r1")
    old_folder = saved(root, old.main_path, 4096, 10, 1)
    new_folder = saved(root, new.main_path, 4096, 10, 1)
    other_folder = saved(root, other.main_path, 4096, 10, 1)
    records.save_record(paths, old)
    records.save_record(paths, other)
    revisions.switch(paths, old, new)
    assert not old_folder.exists() and new_folder.is_dir()
    records.remove_model(paths, "m", delete_foreign=False)
    assert not new_folder.exists() and other_folder.is_dir()
