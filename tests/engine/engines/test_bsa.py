"""Block-Sparse-Attention, PFlash's fast kernel: pinned by tree digest, from the shared tarball
offline or from GitHub's archives of BSA and CUTLASS, and refused when it is not that tree."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import httpx
import pytest

from lucebox.engine.core.errors import EXIT_REFUSED, HashMismatchError, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import bsa, lucebox, sourcetree
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.engines.sourcetree import MARKER_NAME
from support.httpserver import Route, serve_files
from tests.conftest import CliResult, run_lucebox
from tests.engine.engines.test_lucebox_source import (
    DEFAULT_TARBALL,
    ENGINES_DIR,
    needs_tarball,
    source_cli,
)

BSA_TARBALL = ENGINES_DIR / "block-sparse-attention-49d6c39e-cutlass-a75b4ac4.tar.gz"
needs_bsa_tarball = pytest.mark.skipif(
    not BSA_TARBALL.is_file(),
    reason=f"the pinned BSA tarball is not beside the clone ({BSA_TARBALL})",
)
BSA_TOP = f"Block-Sparse-Attention-{bsa.PIN.commit}"
CUTLASS_TOP = f"cutlass-{bsa.PIN.cutlass_commit}"
CUTLASS_IN_BSA = "Block-Sparse-Attention/csrc/cutlass/"
PROBE = "csrc/cutlass/include/cutlass/numeric_types.h"
"""The file the engine's CMakeLists checks before it builds BSA."""


def engine_source(tmp_path: Path) -> SourceInfo:
    return SourceInfo(tmp_path / "lucebox", "pin", lucebox.PIN.identity, None)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def tampered_copy(folder: Path) -> Path:
    """The shared tarball with one CUTLASS header changed by a byte."""
    out = folder / "bsa-tampered.tar.gz"
    with tarfile.open(BSA_TARBALL) as src, tarfile.open(out, "w:gz") as tar:
        for member in src:
            data = src.extractfile(member) if member.isreg() else None
            if data is not None and member.name.endswith(PROBE):
                body = data.read() + b"\n"
                member.size = len(body)
                data = io.BytesIO(body)
            tar.addfile(member, data)
    return out


def github_archives() -> tuple[bytes, bytes]:
    """The shared tarball split the way GitHub serves the two repositories: BSA's archive
    (its CUTLASS submodule left out, files the engine does not read added) and CUTLASS's."""
    ours, theirs = io.BytesIO(), io.BytesIO()
    with (
        tarfile.open(BSA_TARBALL) as src,
        tarfile.open(fileobj=ours, mode="w:gz") as bsa_tar,
        tarfile.open(fileobj=theirs, mode="w:gz") as cutlass_tar,
    ):
        _add(bsa_tar, f"{BSA_TOP}/setup.py", b"# not read\n")
        _add(bsa_tar, f"{BSA_TOP}/csrc/block_sparse_attn/flash_api.cpp", b"// not read\n")
        _add(cutlass_tar, f"{CUTLASS_TOP}/tools/x.cpp", b"// not read\n")
        for member in src:
            if not member.isreg():
                continue
            data = src.extractfile(member)
            if member.name.startswith(CUTLASS_IN_BSA):
                member.name = f"{CUTLASS_TOP}/{member.name.removeprefix(CUTLASS_IN_BSA)}"
                cutlass_tar.addfile(member, data)
            else:
                member.name = f"{BSA_TOP}/{member.name.removeprefix('Block-Sparse-Attention/')}"
                bsa_tar.addfile(member, data)
    return ours.getvalue(), theirs.getvalue()


def routes() -> dict[str, Route]:
    ours, theirs = github_archives()
    bsa_url, cutlass_url = bsa.archive_urls(base_url="http://x")
    return {
        bsa_url.removeprefix("http://x"): Route(ours, "application/x-gzip"),
        cutlass_url.removeprefix("http://x"): Route(theirs, "application/x-gzip"),
    }


def test_members_map_onto_the_kept_tree():
    top = "Block-Sparse-Attention"
    assert bsa.tarball_path(f"{top}/LICENSE") == f"{top}/LICENSE"
    assert (
        bsa.tarball_path(f"./{top}/csrc/cutlass/include/a.h") == f"{top}/csrc/cutlass/include/a.h"
    )
    assert bsa.tarball_path(f"{top}/setup.py") is None
    assert bsa.tarball_path(f"{top}/csrc/block_sparse_attn/src/../../../x") is None
    assert bsa.bsa_archive_path(f"{BSA_TOP}/csrc/block_sparse_attn/src/a.cu") == (
        f"{top}/csrc/block_sparse_attn/src/a.cu"
    )
    assert bsa.bsa_archive_path(f"{BSA_TOP}/csrc/block_sparse_attn/flash_api.cpp") is None
    assert bsa.cutlass_archive_path(f"{CUTLASS_TOP}/include/cute/tensor.hpp") == (
        f"{top}/csrc/cutlass/include/cute/tensor.hpp"
    )
    assert bsa.cutlass_archive_path(f"{CUTLASS_TOP}/LICENSE.txt") == (
        f"{top}/csrc/cutlass/LICENSE.txt"
    )
    assert bsa.cutlass_archive_path(f"{CUTLASS_TOP}/tools/x.cpp") is None


def test_the_archives_are_githubs_for_both_pinned_commits():
    assert bsa.archive_urls() == [
        "https://github.com/mit-han-lab/Block-Sparse-Attention/archive/"
        "49d6c39e4dc0303442cda3bb758b3925d4399c49.tar.gz",
        "https://github.com/NVIDIA/cutlass/archive/a75b4ac483166189a45290783cb0a18af5ff0ea5.tar.gz",
    ]


@pytest.mark.parametrize(
    ("arch", "supported"),
    [("75", False), ("80", True), ("86", True), ("90a", True), ("120", True), ("61", False)],
)
def test_bsa_needs_sm_80_or_newer(arch, supported):
    assert bsa.arch_supports(arch) is supported


@needs_bsa_tarball
def test_the_shared_tarball_is_checked_by_its_tree_digest_and_unpacked_in_place(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = engine_source(tmp_path)
    state = bsa.ensure(paths, source, tarball=BSA_TARBALL, online=False)
    assert state.present
    where = tmp_path / "lucebox" / "server" / "deps" / "Block-Sparse-Attention"
    assert bsa.folder(source) == where
    assert (where / PROBE).is_file()  # what the engine's CMake looks for
    assert (where / "csrc" / "block_sparse_attn" / "src").is_dir()
    files = json.loads((where / MARKER_NAME).read_text())["files"]
    assert len(files) == bsa.PIN.file_count == 636
    assert sourcetree.tree_digest(files) == bsa.PIN.tree_sha256
    assert bsa.check_unpacked(source).present
    # Found again without a tarball or the network.
    assert bsa.ensure(paths, source, online=False).present
    assert not any(p.name.startswith(".Block") for p in where.parent.iterdir())


@needs_bsa_tarball
def test_a_tampered_tarball_is_refused_and_nothing_is_unpacked(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = engine_source(tmp_path)
    with pytest.raises(HashMismatchError, match="is not the pinned tree") as refused:
        bsa.ensure(paths, source, tarball=tampered_copy(tmp_path), online=False)
    assert refused.value.exit_code == EXIT_REFUSED
    assert bsa.PIN.tree_sha256 in refused.value.message
    assert "Block-Sparse-Attention 49d6c39e with CUTLASS a75b4ac4" in refused.value.message
    assert not bsa.folder(source).exists()
    assert not any(bsa.folder(source).parent.iterdir())


@needs_bsa_tarball
def test_a_tree_changed_after_unpacking_is_refused_naming_the_file(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = engine_source(tmp_path)
    bsa.ensure(paths, source, tarball=BSA_TARBALL, online=False)
    (bsa.folder(source) / PROBE).write_text("// edited\n")
    with pytest.raises(HashMismatchError, match=r"1 files differ \(Block-Sparse-Attention/"):
        bsa.check_unpacked(source)


@needs_bsa_tarball
def test_a_connected_pc_fetches_both_archives_and_checks_the_same_digest(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = engine_source(tmp_path)
    served = routes()
    with serve_files(served) as server, httpx.Client() as client:
        state = bsa.ensure(paths, source, base_url=server.base_url, client=client)
        assert sorted(r[1] for r in server.requests) == sorted(served)
    assert state.present
    files = json.loads((bsa.folder(source) / MARKER_NAME).read_text())["files"]
    assert sourcetree.tree_digest(files) == bsa.PIN.tree_sha256
    assert not (bsa.folder(source) / "setup.py").exists()
    assert not any(paths.downloads_dir.iterdir())


def test_no_network_leaves_the_source_without_bsa_and_says_so(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = engine_source(tmp_path)
    with serve_files({}) as server:
        state = bsa.ensure(paths, source, base_url=server.base_url)
    assert not state.present
    assert state.detail.startswith("no BSA: PFlash runs the slow fallback (")
    assert "HTTP 404" in state.detail
    assert not bsa.folder(source).exists()
    offline = bsa.ensure(paths, source, online=False)
    assert not offline.present and "not in" in offline.detail


def test_a_folder_of_other_files_is_not_overwritten(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    source = engine_source(tmp_path)
    bsa.folder(source).mkdir(parents=True)
    (bsa.folder(source) / "mine.txt").write_text("keep")
    (tmp_path / "x.tar.gz").write_bytes(b"")
    with pytest.raises(UsageError, match="holds files lucebox did not unpack"):
        bsa.ensure(paths, source, tarball=tmp_path / "x.tar.gz")
    assert (bsa.folder(source) / "mine.txt").read_text() == "keep"


def default_source_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str
) -> CliResult:
    """`lucebox engine source --engine lucebox` of the default source from its shared tarball."""
    return source_cli(
        monkeypatch, capsys, tmp_path / "home", "--tarball", str(DEFAULT_TARBALL), *args
    )


@needs_tarball
@needs_bsa_tarball
def test_cli_takes_the_bsa_tarball_offline_and_refuses_a_tampered_one(
    tmp_path, monkeypatch, capsys
):
    tampered = tampered_copy(tmp_path)
    refused = default_source_cli(monkeypatch, capsys, tmp_path, "--bsa-tarball", str(tampered))
    assert refused.returncode == EXIT_REFUSED
    assert "the Block-Sparse-Attention source from" in refused.stderr
    assert "is not the pinned tree" in refused.stderr
    taken = default_source_cli(
        monkeypatch, capsys, tmp_path, "--bsa-tarball", str(BSA_TARBALL), "--json"
    )
    assert taken.returncode == 0, taken.stderr
    document = json.loads(taken.stdout)
    assert document["bsa"] is True
    where = Path(document["path"]) / "server" / "deps" / "Block-Sparse-Attention"
    assert where.is_relative_to(tmp_path / "home")
    assert (where / PROBE).is_file()


@needs_tarball
def test_cli_without_the_bsa_tarball_offline_says_pflash_is_slow(tmp_path, monkeypatch, capsys):
    taken = default_source_cli(monkeypatch, capsys, tmp_path)
    assert taken.returncode == 0, taken.stderr
    assert "no BSA: PFlash runs the slow fallback" in taken.stdout


def test_cli_refuses_the_bsa_tarball_for_llama_server(tmp_path):
    result = run_lucebox(
        "engine", "source", "--bsa-tarball", "x.tar.gz",
        env={"LUCEBOX_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert result.returncode == 2
    assert "--bsa-tarball does not apply to --engine llama-server" in result.stderr
