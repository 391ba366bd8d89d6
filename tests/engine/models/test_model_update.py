"""`models update | rollback | prune` against the local Hub server: a repo gains a revision
where one file changes, and only that file is downloaded; the way back costs no download."""

from __future__ import annotations

import json
import time

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.doctor import check_model_updates
from lucebox.engine.models.pull import pull_model
from lucebox.engine.models.records import find_model
from lucebox.engine.plan.speculation.measurements import file_identity
from support.ggufgen import ModelSpec, write_llama
from support.hubserver import COMMIT, HubFile
from tests.conftest import assert_one_line_error, run_lucebox

NEWER = "fedcba9876543210fedcba9876543210fedcba98"
SHARDS = [f"big-instruct-{n:05d}-of-00002.gguf" for n in (1, 2)]


def _shard(tmp_path, number: int, n_embd: int = 64) -> bytes:
    spec = ModelSpec(n_embd=n_embd, extra_kv={"split.count": 2, "split.no": number})
    folder = tmp_path / f"shard{number}-{n_embd}"
    folder.mkdir()
    return write_llama(folder / SHARDS[number], spec).read_bytes()


def _pulled_split(hub, tmp_path):
    for number, name in enumerate(SHARDS):
        hub.add("acme/big", name, HubFile(_shard(tmp_path, number)))
    return pull_model(resolve_paths(), f"hf:acme/big/{SHARDS[0]}")


def _downloads(hub) -> list[str]:
    return [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]


def test_a_new_revision_pulls_only_the_changed_file_switches_and_rolls_back(hub, tmp_path):
    paths = resolve_paths()
    old = _pulled_split(hub, tmp_path)
    old_identity = file_identity(old.main_path, paths)
    changed = _shard(tmp_path, 1, n_embd=128)
    hub.new_revision("acme/big", NEWER, {SHARDS[1]: HubFile(changed)})
    served_before = dict(hub.bytes_served)

    result = run_lucebox("models", "update", "big-instruct", "--json")

    assert result.returncode == 0, result.stderr
    [report] = json.loads(result.stdout)["models"]
    assert report["switched"] and report["changed_files"] == [SHARDS[1]]
    assert report["pulled_files"] == [SHARDS[1]]
    assert report["current_revision"] == COMMIT and report["newest_revision"] == NEWER
    fetched = {k: v - served_before.get(k, 0) for k, v in hub.bytes_served.items()}
    assert {k: v for k, v in fetched.items() if v} == {("acme/big", SHARDS[1]): len(changed)}
    new = find_model(paths, "big-instruct")
    assert new.revision == NEWER and new.source == old.source
    # Shards load from one folder: the unchanged one is linked there, not downloaded again.
    assert {f.path.rsplit("/", 2)[1] for f in new.files} == {NEWER[:12]}
    assert new.main_path.stat().st_ino == old.main_path.stat().st_ino
    assert all(f.sha256 for f in new.files) and new.files[1].sha256 != old.files[1].sha256
    assert all(old_file.exists() for old_file in (old.main_path, old.main_path.parent / SHARDS[1]))
    # The first shard is the same bytes, yet the measurements of the old revision do not hold.
    assert file_identity(new.main_path, paths) != old_identity

    downloads = len(_downloads(hub))
    started_s = time.monotonic()
    back = run_lucebox("models", "rollback", "big-instruct", "--json")
    rollback_s = time.monotonic() - started_s
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout) == {
        "name": "big-instruct",
        "from_revision": NEWER,
        "to_revision": COMMIT,
    }
    assert find_model(paths, "big-instruct") == old
    assert file_identity(old.main_path, paths) == old_identity
    assert len(_downloads(hub)) == downloads and rollback_s < 10

    # Updating again after the rollback finds the new revision's files on disk: no download.
    served_before = dict(hub.bytes_served)
    forward = run_lucebox("models", "update", "big-instruct")
    assert forward.returncode == 0, forward.stderr
    assert hub.bytes_served == served_before
    assert find_model(paths, "big-instruct").files == new.files
    pruned = run_lucebox("models", "prune", "--json")
    assert pruned.returncode == 0, pruned.stderr
    gone = json.loads(pruned.stdout)
    assert sorted(gone["deleted"]) == sorted(f.path for f in old.files)
    assert gone["revisions"] == [{"name": "big-instruct", "revision": COMMIT}]
    assert run_lucebox("models", "verify", "big-instruct").returncode == 0
    again = run_lucebox("models", "rollback", "big-instruct")
    assert again.returncode == 2 and "no earlier revision of big-instruct" in again.stderr


def test_a_revision_whose_file_fails_its_guard_is_not_switched_to(hub, tmp_path):
    paths = resolve_paths()
    good = write_llama(tmp_path / "tiny-instruct-f16.gguf", ModelSpec(n_embd=64)).read_bytes()
    hub.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(good))
    old = pull_model(paths, "hf:acme/tiny/tiny-instruct-f16.gguf")
    hub.new_revision("acme/tiny", NEWER, {"tiny-instruct-f16.gguf": HubFile(b"GGUF" + b"\0" * 64)})

    result = run_lucebox("models", "update", "tiny-instruct-f16")

    assert result.returncode == 3
    assert_one_line_error(result)
    assert f"revision {NEWER[:12]} of tiny-instruct-f16 was refused" in result.stderr
    assert f"tiny-instruct-f16 stays at revision {COMMIT[:12]}" in result.stderr
    assert find_model(paths, "tiny-instruct-f16") == old and old.main_path.exists()
    assert list((paths.models_dir / "quarantine").iterdir())
    assert run_lucebox("models", "rollback", "tiny-instruct-f16").returncode == 2


def test_a_model_whose_repo_has_not_moved_is_up_to_date(hub, tmp_path):
    _pulled_split(hub, tmp_path)
    downloads = len(_downloads(hub))
    result = run_lucebox("models", "update")
    assert result.returncode == 0, result.stderr
    assert f"big-instruct: up to date (revision {COMMIT[:12]} of acme/big)" in result.stdout
    assert len(_downloads(hub)) == downloads
    offline = run_lucebox("models", "update", "big-instruct", env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 1 and "HF_HUB_OFFLINE is set" in offline.stderr
    assert_one_line_error(offline)


def test_doctor_says_when_a_newer_revision_exists_and_when_it_could_not_check(
    hub, tmp_path, monkeypatch
):
    paths = resolve_paths()
    _pulled_split(hub, tmp_path)
    assert check_model_updates(paths) == []
    hub.new_revision("acme/big", NEWER, {SHARDS[1]: HubFile(_shard(tmp_path, 1, n_embd=128))})
    [newer] = check_model_updates(paths)
    assert newer.verdict == "warn" and f"newer revision {NEWER[:12]}" in newer.detail
    assert "lucebox models update big-instruct" in newer.action
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    [unreachable] = check_model_updates(paths)
    assert unreachable.verdict == "ok" and "could not check" in unreachable.detail
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    [offline] = check_model_updates(paths)
    assert offline.verdict == "ok" and "HF_HUB_OFFLINE" in offline.detail


@pytest.mark.slow
def test_the_new_revision_is_load_tested_on_the_engine_before_it_switches(
    built_engine_home, hub, tmp_path, monkeypatch
):
    from support.smolserver import private_engine_home

    home = private_engine_home(tmp_path / "engine-home")
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_llama(tmp_path / "a" / "tiny-instruct-f16.gguf", ModelSpec(n_embd=64))
    hub.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(first.read_bytes()))
    pull_model(resolve_paths(), "hf:acme/tiny/tiny-instruct-f16.gguf")
    second = write_llama(tmp_path / "b" / "tiny-instruct-f16.gguf", ModelSpec(n_embd=128))
    hub.new_revision("acme/tiny", NEWER, {"tiny-instruct-f16.gguf": HubFile(second.read_bytes())})

    result = run_lucebox("models", "update", "--ctx", "2048", "--json", timeout_s=900)

    assert result.returncode == 0, result.stderr
    [report] = json.loads(result.stdout)["models"]
    assert report["switched"] and report["load_test"]["passed"], report
    assert "answered a chat" in report["load_test"]["detail"]
    assert find_model(resolve_paths(), "tiny-instruct-f16").revision == NEWER


def test_a_revision_that_fails_its_load_test_is_not_switched_to_and_its_files_go(hub, tmp_path):
    from lucebox.engine.machine import config
    from tests.engine.engines.test_update import installed_engine

    paths = resolve_paths()
    first = write_llama(tmp_path / "tiny-instruct-f16.gguf", ModelSpec(n_embd=64)).read_bytes()
    hub.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(first))
    old = pull_model(paths, "hf:acme/tiny/tiny-instruct-f16.gguf")
    second = tmp_path / "b" / "tiny-instruct-f16.gguf"
    second.parent.mkdir()
    write_llama(second, ModelSpec(n_embd=128))
    hub.new_revision("acme/tiny", NEWER, {"tiny-instruct-f16.gguf": HubFile(second.read_bytes())})
    # An engine that dies at every start: the new revision never loads.
    installed_engine(paths, "broken", script="#!/bin/sh\necho 'failed to load model'\nexit 1\n")
    config.set_setting(paths, "engine.id", "broken")

    result = run_lucebox("models", "update", "tiny-instruct-f16", timeout_s=300)

    assert result.returncode == 3, result.stderr
    assert_one_line_error(result)
    assert "did not pass its load test" in result.stderr
    assert f"tiny-instruct-f16 stays at revision {COMMIT[:12]}" in result.stderr
    assert find_model(paths, "tiny-instruct-f16") == old
    revision_folder = old.main_path.parent / NEWER[:12]
    assert not revision_folder.exists() or not any(revision_folder.iterdir())


def test_a_source_pinned_to_a_revision_is_pinned_to_the_new_one(hub, tmp_path):
    paths = resolve_paths()
    first = write_llama(tmp_path / "tiny-instruct-f16.gguf", ModelSpec(n_embd=64)).read_bytes()
    hub.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(first))
    pull_model(paths, f"hf:acme/tiny/tiny-instruct-f16.gguf@{COMMIT}")
    second = tmp_path / "b" / "tiny-instruct-f16.gguf"
    second.parent.mkdir()
    write_llama(second, ModelSpec(n_embd=128))
    hub.new_revision("acme/tiny", NEWER, {"tiny-instruct-f16.gguf": HubFile(second.read_bytes())})

    assert run_lucebox("models", "update").returncode == 0

    record = find_model(paths, "tiny-instruct-f16")
    assert record.source == f"hf:acme/tiny/tiny-instruct-f16.gguf@{NEWER}"
    assert record.main_path.read_bytes() == second.read_bytes()


def test_a_refused_revision_of_a_split_model_leaves_no_links_behind(hub, tmp_path):
    paths = resolve_paths()
    old = _pulled_split(hub, tmp_path)
    hub.new_revision("acme/big", NEWER, {SHARDS[0]: HubFile(b"GGUF" + b"\0" * 64)})

    result = run_lucebox("models", "update", "big-instruct")

    assert result.returncode == 3 and "stays at revision" in result.stderr
    assert find_model(paths, "big-instruct") == old
    assert not (old.main_path.parent / NEWER[:12]).exists()
