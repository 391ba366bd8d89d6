"""Downloads against a real loopback server: the faults a model or engine download meets."""

from __future__ import annotations

import email.utils
import hashlib
import os
import ssl
import time

import pytest
import trustme

from lucebox.engine.core import downloadattempt
from lucebox.engine.core.download import RetryPolicy, download_file
from lucebox.engine.core.downloadprogress import TransferProgress, duration_text, progress_parts
from lucebox.engine.core.errors import HashMismatchError, TransferError, TransferRefusedError
from support.httpserver import Route, serve_files

BODY = os.urandom(3 * 1024 * 1024 + 123)
SHA256 = hashlib.sha256(BODY).hexdigest()
FAST = RetryPolicy(max_idle_attempts=3, stall_s=0.5, backoff_max_s=0.05)
"""Small settings so that retries and stalls take a fraction of a second."""


def test_a_server_that_ignores_range_gives_a_whole_file_not_a_doubled_one(tmp_path):
    dest = tmp_path / "model.gguf"
    dest.with_name("model.gguf.part").write_bytes(BODY[:1000])
    with serve_files({"/m": Route(BODY, honours_range=False)}) as server:
        download_file(f"{server.base_url}/m", dest, sha256=SHA256, size_bytes=len(BODY))
        assert server.requests == [("GET", "/m", "bytes=1000-")]
    assert dest.read_bytes() == BODY
    assert not dest.with_name("model.gguf.part").exists()


def test_other_bytes_than_published_are_a_hash_mismatch_and_deleted(tmp_path):
    dest = tmp_path / "engine.tar.gz"
    other = BODY[:-1] + bytes([BODY[-1] ^ 0xFF])  # a fixed b"x" equalled it 1 run in 256
    with (
        serve_files({"/e": Route(other)}) as server,
        pytest.raises(HashMismatchError, match=f"expected {SHA256}") as caught,
    ):
        download_file(f"{server.base_url}/e", dest, sha256=SHA256)
    assert caught.value.exit_code == 3
    assert not dest.exists() and not dest.with_name("engine.tar.gz.part").exists()
    assert len(server.requests) == 1  # not retried


def test_cuts_without_a_known_size_are_resumed_within_the_run(tmp_path):
    dest = tmp_path / "engine.tar.gz"
    with serve_files({"/e": Route(BODY, cut_after_bytes=100_000, cuts_left=3)}) as server:
        download_file(f"{server.base_url}/e", dest, sha256=SHA256, policy=FAST)
        ranges = [r[2] for r in server.requests]
    assert ranges == [None, "bytes=100000-", "bytes=200000-", "bytes=300000-"]
    assert dest.read_bytes() == BODY


def test_giving_up_keeps_the_partial_and_says_how_to_resume(tmp_path):
    dest = tmp_path / "engine.tar.gz"
    # Every request after the first is cut before its first body byte: no progress at all.
    route = Route(BODY, cut_after_bytes=100_000, cuts_left=1)
    with serve_files({"/e": route}) as server:
        events: list[TransferProgress] = []

        def cut_every_later_request(event: TransferProgress) -> None:
            events.append(event)
            route.cut_after_bytes, route.cuts_left = 0, 10

        with pytest.raises(TransferError, match=r"gave up after 3 attempts") as caught:
            download_file(
                f"{server.base_url}/e",
                dest,
                sha256=SHA256,
                policy=FAST,
                on_progress=cut_every_later_request,
            )
        assert "100000 bytes are on disk" in caught.value.message
        assert "resume" in (caught.value.hint or "")
        assert len(server.requests) == 4
        assert dest.with_name("engine.tar.gz.part").stat().st_size == 100_000
        assert [e.attempt for e in events if e.waiting_s is not None][:1] == [2]
        route.cuts_left = 0
        download_file(f"{server.base_url}/e", dest, sha256=SHA256, policy=FAST)
        assert server.requests[-1] == ("GET", "/e", "bytes=100000-")
    assert dest.read_bytes() == BODY


def test_a_stalled_server_gives_up_with_a_clear_message(tmp_path):
    dest = tmp_path / "model.gguf"
    started = time.monotonic()
    with (
        serve_files({"/m": Route(BODY, stall_s=3)}) as server,
        pytest.raises(TransferError, match=r"without a new byte \(last: no data for 0.5 s\)"),
    ):
        download_file(f"{server.base_url}/m", dest, sha256=SHA256, policy=FAST)
    assert 1.5 <= time.monotonic() - started < 2.9
    assert not dest.exists()


@pytest.mark.parametrize("code", [401, 403, 404, 410])
def test_refusals_are_not_retried(tmp_path, code):
    with serve_files({"/m": Route(BODY, status=code)}) as server:
        with pytest.raises(TransferRefusedError, match=f"HTTP {code}") as caught:
            download_file(f"{server.base_url}/m", tmp_path / "m", sha256=SHA256, policy=FAST)
        assert caught.value.status == code
        assert len(server.requests) == 1


def test_nothing_listening_is_a_one_line_failure(tmp_path):
    with serve_files() as server:
        url = f"{server.base_url}/m"
    started = time.monotonic()
    with pytest.raises(TransferError, match="Connection refused"):
        download_file(url, tmp_path / "m", sha256=SHA256)
    assert time.monotonic() - started < 0.9  # a server never reached is not waited for


@pytest.fixture
def tls_server_context() -> tuple[ssl.SSLContext, trustme.CA]:
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    return context, authority


def test_https_downloads_trust_what_httpx_trusts(tmp_path, monkeypatch, tls_server_context):
    context, authority = tls_server_context
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    with serve_files({"/m": Route(BODY, cut_after_bytes=50_000)}, tls=context) as server:
        url = f"{server.base_url}/m"
        assert url.startswith("https://")
        download_file(url, tmp_path / "m", sha256=SHA256, policy=FAST)
        assert [r[2] for r in server.requests] == [None, "bytes=50000-"]
    assert (tmp_path / "m").read_bytes() == BODY


def test_https_refuses_a_certificate_nobody_vouches_for(tmp_path, monkeypatch, tls_server_context):
    context, _ = tls_server_context
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with (
        serve_files({"/m": Route(BODY)}, tls=context) as server,
        pytest.raises(TransferError, match="certificate is not trusted") as caught,
    ):
        download_file(f"{server.base_url}/m", tmp_path / "m", sha256=SHA256)
    assert "SSL_CERT_FILE" in (caught.value.hint or "")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.01, "1 s"), (1.0, "1 s"), (59.2, "1 min 00 s"), (125, "2 min 05 s"), (7322, "2 h 02 min")],
)
def test_time_left_is_rounded_up_so_it_never_reads_zero(seconds, text):
    assert duration_text(seconds) == text


def test_progress_words_say_what_is_not_known_and_when_it_retries():
    assert progress_parts(None, None) == ("— MiB/s", "— left")
    assert progress_parts(2**20, 0.2) == ("1.0 MiB/s", "1 s left")
    assert progress_parts(2**20, 0.0) == ("1.0 MiB/s",)
    assert progress_parts(2**20, 30, attempt=3) == ("1.0 MiB/s", "30 s left", "attempt 3")
    waiting = progress_parts(None, None, attempt=4, waiting_s=3.5, retry_reason="HTTP 503")
    assert waiting == ("HTTP 503", "attempt 4 in 4 s")


def test_backoff_doubles_up_to_its_cap():
    policy = RetryPolicy()
    assert [policy.backoff_s(n) for n in range(10)] == [1, 1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert sum(policy.backoff_s(n) for n in range(1, policy.max_idle_attempts)) == 243


def test_retry_after_takes_seconds_or_a_date():
    assert downloadattempt._retry_after_s("7") == 7.0
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= (downloadattempt._retry_after_s(later) or 0) <= 31
    assert downloadattempt._retry_after_s("soon") is None
