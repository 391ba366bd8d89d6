"""The Lucebox engine's pinned source: fetched as GitHub serves it, verified by tree digest."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import httpx
import pytest

from lucebox.app.cli.parser import main
from lucebox.engine.core.errors import EXIT_REFUSED, HashMismatchError, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import lucebox, sourcetree
from lucebox.engine.engines.known import KnownSource
from lucebox.engine.engines.sourcetree import MARKER_NAME
from support.httpserver import Route, serve_files
from tests.conftest import CliResult, assert_one_line_error, run_lucebox

ENGINES_DIR = Path(__file__).resolve().parents[4] / "shared" / "engines"
"""Where the shared source tarballs lie, beside the clone."""


def tarball_of(version: str) -> Path:
    """The shared tarball of the known source ``version``'s server tree."""
    return ENGINES_DIR / f"lucebox-{version}-server.tar.gz"


DEFAULT = lucebox.SOURCES.default
DEFAULT_TARBALL = tarball_of(DEFAULT.version)
"""The tarball of the source a fresh install builds."""
needs_tarball = pytest.mark.skipif(
    not DEFAULT_TARBALL.is_file(),
    reason=f"the default Lucebox source's tarball is not beside the clone ({DEFAULT_TARBALL})",
)


def known_source(version: str) -> KnownSource[lucebox.LuceboxPin]:
    found = lucebox.SOURCES.by_version(version)
    assert found is not None, f"{version} is not a known Lucebox source"
    return found


OLDER = known_source("62880e20")
"""The known source the default replaced: an older build lucebox still knows."""
OLDER_TARBALL = tarball_of(OLDER.version)
needs_older_tarball = pytest.mark.skipif(
    not OLDER_TARBALL.is_file(),
    reason=f"the 62880e20 Lucebox source tarball is not beside the clone ({OLDER_TARBALL})",
)
PREFIX = f"lucebox-{lucebox.PIN.commit}"
ARCHIVE_PATH = f"/Luce-Org/lucebox/archive/{lucebox.PIN.commit}.tar.gz"


def source_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path, *args: str
) -> CliResult:
    """`lucebox engine source --engine lucebox ARGS` in this process, with LUCEBOX_HOME at
    ``home`` and the tree in its data folder: as a subprocess run from this checkout it would
    unpack into the checkout's own deps/lucebox and leave it there for the next run."""
    monkeypatch.setattr(lucebox, "checkout_root", lambda: None)
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    capsys.readouterr()
    code = main(["engine", "source", "--engine", "lucebox", *args])
    out, err = capsys.readouterr()
    return CliResult(code, out, err)


def _add(tar: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name)
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
        return
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def github_archive(*, change: str | None = None, drop: str | None = None) -> bytes:
    """The default source's tarball laid out as GitHub's archive of the whole repo at the pinned
    commit: one top folder, files outside server/, and what the tree digest leaves out."""
    out = io.BytesIO()
    with tarfile.open(DEFAULT_TARBALL) as src, tarfile.open(fileobj=out, mode="w:gz") as tar:
        _add(tar, f"{PREFIX}/", None)
        _add(tar, f"{PREFIX}/README.md", b"# lucebox\n")
        _add(tar, f"{PREFIX}/server/eval/data.jsonl", b"{}\n")
        _add(tar, f"{PREFIX}/server/examples/run.sh", b"echo\n")
        _add(tar, f"{PREFIX}/server/docs/ddtree.png", b"\x89PNG")
        _add(tar, f"{PREFIX}/server/deps/Block-Sparse-Attention/", None)
        for member in src:
            if member.name == drop:
                continue
            member.name = f"{PREFIX}/{member.name}"
            data = src.extractfile(member) if member.isreg() else None
            if data is not None and member.name == f"{PREFIX}/{change}":
                body = data.read() + b"\n"
                member.size = len(body)
                data = io.BytesIO(body)
            tar.addfile(member, data)
    return out.getvalue()


def test_tree_paths_keep_server_and_leave_out_what_the_digest_excludes():
    assert lucebox.tree_path(f"{PREFIX}/server/CMakeLists.txt") == "server/CMakeLists.txt"
    assert lucebox.tree_path("server/src/a.cpp") == "server/src/a.cpp"
    assert lucebox.tree_path(f"{PREFIX}/README.md") is None
    assert lucebox.tree_path(f"{PREFIX}/server/eval/x.json") is None
    assert lucebox.tree_path(f"{PREFIX}/server/examples/x.py") is None
    assert lucebox.tree_path(f"{PREFIX}/server/docs/a.gif") is None
    assert lucebox.tree_path(f"{PREFIX}/server/deps/Block-Sparse-Attention/x.h") is None
    assert lucebox.tree_path(f"{PREFIX}/server/../etc/passwd") is None


def test_the_digest_is_sha256sum_of_sorted_lines():
    hashes = {"server/b": "2" * 64, "server/B": "1" * 64, "server/a": "3" * 64}
    text = f"{'1' * 64}  server/B\n{'3' * 64}  server/a\n{'2' * 64}  server/b\n"
    assert sourcetree.tree_digest(hashes) == hashlib.sha256(text.encode()).hexdigest()


def test_the_archive_url_is_githubs_for_the_pinned_commit():
    assert lucebox.archive_url() == (
        "https://github.com/Luce-Org/lucebox/archive/"
        "4cf58a04c9f6b7c117a54c09ab1cb004d13175c9.tar.gz"
    )


@needs_tarball
def test_fetch_from_githubs_archive_url_verifies_and_unpacks(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    target = tmp_path / "deps" / "lucebox"
    with serve_files({ARCHIVE_PATH: Route(github_archive(), "application/x-gzip")}) as server:
        with httpx.Client() as client:
            info = lucebox.ensure_source(
                paths, source_dir=target, base_url=server.base_url, client=client
            )
        assert [r[1] for r in server.requests] == [ARCHIVE_PATH]
    assert info.identity == lucebox.PIN.identity
    assert (target / "server" / "CMakeLists.txt").is_file()
    assert not (target / "README.md").exists()
    assert not (target / "server" / "eval").exists()
    # The download is not kept, and a second call finds the tree without fetching.
    assert not any(paths.downloads_dir.iterdir())
    again = lucebox.ensure_source(paths, source_dir=target, base_url="http://127.0.0.1:9")
    assert again == info


@needs_tarball
def test_the_local_tarball_serves_an_offline_pc(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    info = lucebox.ensure_source(paths, source_dir=tmp_path / "src", tarball=DEFAULT_TARBALL)
    assert info.identity == DEFAULT.identity
    assert lucebox.server_dir(info).joinpath("src", "server", "server_main.cpp").is_file()


@needs_older_tarball
def test_62880e20_is_checked_from_the_shared_tarball_by_its_tree_digest(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    target = tmp_path / "deps" / "lucebox"
    info = lucebox.ensure_source(paths, source_dir=target, tarball=OLDER_TARBALL, pin=OLDER.pin)
    assert (
        info.identity
        == OLDER.identity
        == (
            "lucebox:62880e2013fc0b808e9cfbba545a5842b35dc50f "
            "tree-sha256:557fdfc479df6dbb693d044690d0cf0f77927802e7436733ec0c7ddf63cff2a9"
        )
    )
    files = json.loads((target / MARKER_NAME).read_text())["files"]
    assert len(files) == OLDER.pin.file_count == 1470
    assert sourcetree.tree_digest(files) == OLDER.pin.tree_sha256
    assert lucebox.pin_of(info) is OLDER.pin
    lucebox.check_unpacked(info)  # unchanged since it was unpacked
    # The same folder asked for the default source is replaced by that tree, never taken for it.
    with pytest.raises(HashMismatchError, match="not the pinned tree"):
        lucebox.ensure_source(paths, source_dir=target, tarball=OLDER_TARBALL)
    assert lucebox.read_source(target, OLDER.pin) == info


@needs_tarball
@pytest.mark.parametrize(
    ("change", "drop"),
    [("server/CMakeLists.txt", None), (None, "server/src/server/server_main.cpp")],
    ids=["corrupted", "different-tree"],
)
def test_a_corrupted_or_different_tree_is_refused(tmp_path, change, drop):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    target = tmp_path / "deps" / "lucebox"
    body = github_archive(change=change, drop=drop)
    with (
        serve_files({ARCHIVE_PATH: Route(body)}) as server,
        pytest.raises(HashMismatchError, match="not the pinned tree") as refused,
    ):
        lucebox.ensure_source(paths, source_dir=target, base_url=server.base_url)
    assert refused.value.exit_code == EXIT_REFUSED
    assert lucebox.PIN.tree_sha256 in refused.value.message
    assert not target.exists()
    assert not any(p.name.startswith(".lucebox") for p in target.parent.iterdir())


def test_an_archive_without_the_server_folder_is_refused(tmp_path):
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "other-1/README.md", b"x")
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    with pytest.raises(HashMismatchError, match="no server/ folder"):
        lucebox.ensure_source(paths, source_dir=tmp_path / "src", tarball=archive)


def test_a_folder_of_other_files_is_not_overwritten(tmp_path):
    target = tmp_path / "src"
    target.mkdir()
    (target / "mine.txt").write_text("keep")
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    with pytest.raises(UsageError, match="not the pinned Lucebox engine source"):
        lucebox.ensure_source(paths, source_dir=target, tarball=tmp_path / "none.tar.gz")


def test_cli_refuses_a_corrupt_tarball_with_exit_3(tmp_path, monkeypatch, capsys):
    archive = tmp_path / "lucebox.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "server/CMakeLists.txt", b"not the engine\n")
    result = source_cli(monkeypatch, capsys, tmp_path / "home", "--tarball", str(archive))
    assert result.returncode == EXIT_REFUSED
    assert_one_line_error(result)
    assert "not the pinned tree" in result.stderr


def test_cli_refuses_the_other_engines_flags(tmp_path):
    result = run_lucebox(
        "engine", "source", "--engine", "lucebox", "--sdist", "x.tar.gz",
        env={"LUCEBOX_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert result.returncode == 2
    assert "--sdist does not apply to --engine lucebox" in result.stderr


@needs_older_tarball
def test_cli_fetches_a_named_known_version_from_its_tarball(tmp_path, monkeypatch, capsys):
    """`engine source --version` names a known source other than the default: an offline PC
    unpacks 62880e20 from its tarball, checked by that source's digest."""
    older = ("--tarball", str(OLDER_TARBALL))
    result = source_cli(
        monkeypatch, capsys, tmp_path / "home", "--version", "62880e20", *older, "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["identity"] == OLDER.identity
    # The default source's check refuses the same tarball: the version decides the digest.
    assert source_cli(monkeypatch, capsys, tmp_path / "other", *older).returncode == EXIT_REFUSED


def test_cli_refuses_an_unknown_version_and_lists_the_known_ones(tmp_path):
    result = run_lucebox(
        "engine", "build", "--engine", "lucebox", "--version", "deadbeef",
        env={"LUCEBOX_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert result.returncode == 2
    assert_one_line_error(result)
    assert "deadbeef is not a known source of" in result.stderr
    assert "62880e20, 4cf58a04" in result.stderr
