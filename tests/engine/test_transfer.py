"""Downloads against a real loopback server: the faults a model or engine download meets."""

from __future__ import annotations

import hashlib
import os
import ssl

import pytest
import trustme

from lucebox.engine.errors import HashMismatchError
from lucebox.engine.transfer import TransferError, download_file
from tests.httpserver import Route, serve_files

BODY = os.urandom(3 * 1024 * 1024 + 123)
SHA256 = hashlib.sha256(BODY).hexdigest()


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
    with (
        serve_files({"/e": Route(BODY[:-1] + b"x")}) as server,
        pytest.raises(HashMismatchError, match=f"expected {SHA256}") as caught,
    ):
        download_file(f"{server.base_url}/e", dest, sha256=SHA256)
    assert caught.value.exit_code == 3
    assert not dest.exists() and not dest.with_name("engine.tar.gz.part").exists()


def test_a_cut_without_a_known_size_keeps_the_partial_for_a_resume(tmp_path):
    dest = tmp_path / "engine.tar.gz"
    with serve_files({"/e": Route(BODY, cut_after_bytes=100_000)}) as server:
        with pytest.raises(TransferError, match=r"stopped at 100000 of \d+ bytes") as caught:
            download_file(f"{server.base_url}/e", dest, sha256=SHA256)
        assert "resume" in (caught.value.hint or "")
        assert dest.with_name("engine.tar.gz.part").stat().st_size == 100_000
        download_file(f"{server.base_url}/e", dest, sha256=SHA256)
        assert server.requests[-1] == ("GET", "/e", "bytes=100000-")
    assert dest.read_bytes() == BODY


def test_a_stalled_server_times_out_with_a_clear_message(tmp_path):
    dest = tmp_path / "model.gguf"
    with (
        serve_files({"/m": Route(BODY, stall_s=3)}) as server,
        pytest.raises(TransferError, match=r"failed: no data for 0.5 s"),
    ):
        download_file(f"{server.base_url}/m", dest, sha256=SHA256, timeout_s=0.5)
    assert not dest.exists()


def test_nothing_listening_is_a_one_line_failure(tmp_path):
    with serve_files() as server:
        url = f"{server.base_url}/m"
    with pytest.raises(TransferError, match="Connection refused"):
        download_file(url, tmp_path / "m", sha256=SHA256)


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
        with pytest.raises(TransferError, match="stopped at"):
            download_file(url, tmp_path / "m", sha256=SHA256)
        download_file(url, tmp_path / "m", sha256=SHA256)
        assert server.requests[-1] == ("GET", "/m", "bytes=50000-")
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
