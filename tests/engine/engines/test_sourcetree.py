"""What is built is what was pinned: an unpacked source tree is hashed again before a build, and
a file changed, added or removed since it was unpacked is refused, with the way back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucebox.engine.core.errors import EXIT_REFUSED, HashMismatchError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import (
    install,
    kinds,
    lucebox,
    luceboxbuild,
    source,
    sourcetree,
)
from lucebox.engine.engines.build import BuildOptions
from lucebox.engine.engines.sourcetree import MARKER_NAME
from tests.engine.engines.test_lucebox_source import DEFAULT, DEFAULT_TARBALL, needs_tarball
from tests.engine.engines.test_source import SDIST, pin_for

DEPS_FILE = "server/deps/llama.cpp/ggml/src/ggml.c"
"""A file of the Lucebox engine's vendored ggml, under ``deps/``."""


def test_differences_name_each_file_changed_added_or_missing():
    recorded = {"a": "1", "b": "2", "c": "3"}
    actual = {"a": "1", "b": "9", "d": "4"}
    assert sourcetree.differences(recorded, actual) == ["b changed", "c missing", "d added"]


def test_a_refusal_names_three_files_and_counts_the_rest(tmp_path):
    recorded = {f"f{i}": "0" for i in range(5)}
    actual = {f"f{i}": "1" for i in range(5)}
    with pytest.raises(HashMismatchError) as refused:
        sourcetree.check_unchanged(
            tmp_path, actual, "x", recorded, what="the source", way_back="delete it"
        )
    assert "5 files differ (f0 changed, f1 changed, f2 changed and 2 more)" in str(refused.value)
    assert refused.value.hint == "delete it"


# --- llama.cpp's unpacked sdist ---------------------------------------------------------------


@pytest.fixture
def llama_source(tmp_path) -> source.SourceInfo:
    sdist = tmp_path / "pkg-1.0.tar.gz"
    sdist.write_bytes(SDIST)
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    return source.ensure_source(
        paths, source_dir=tmp_path / "deps" / "llama.cpp", sdist=sdist, pin=pin_for(SDIST)
    )


def test_the_unpacked_sdist_records_its_tree_and_passes_unchanged(llama_source):
    marker = json.loads((llama_source.path / MARKER_NAME).read_text())
    assert set(marker["files"]) == {"CMakeLists.txt", "src/llama-arch.cpp"}
    assert marker["tree_sha256"] == sourcetree.tree_digest(marker["files"])
    source.check_unpacked(llama_source)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda root: (root / "src" / "llama-arch.cpp").write_text("// patched\n"), "changed"),
        (lambda root: (root / "src" / "extra.cpp").write_text("int x;\n"), "added"),
        (lambda root: (root / "CMakeLists.txt").unlink(), "missing"),
    ],
    ids=["changed", "added", "missing"],
)
def test_a_changed_llama_cpp_tree_is_refused_with_the_way_back(llama_source, edit, named):
    edit(llama_source.path)
    with pytest.raises(HashMismatchError, match=f"1 files differ \\(.* {named}\\)") as refused:
        kinds.LLAMA_SERVER.check_source(llama_source)  # what `engine source` runs
    assert refused.value.exit_code == EXIT_REFUSED
    assert f"delete {llama_source.path}" in (refused.value.hint or "")
    assert "lucebox engine source" in (refused.value.hint or "")


def test_the_build_refuses_a_changed_tree_before_it_compiles(llama_source, tmp_path):
    (llama_source.path / "CMakeLists.txt").write_text("project(other)\n")
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    with pytest.raises(HashMismatchError, match=r"CMakeLists\.txt changed"):
        install.build_and_install(paths, llama_source, BuildOptions("cpu", webui=False))
    assert [p.name for p in paths.builds_dir.iterdir()] == [".lock"]  # cmake never ran


def test_a_tree_unpacked_before_trees_were_recorded_is_unpacked_again(llama_source, tmp_path):
    marker_file = llama_source.path / MARKER_NAME
    marker = json.loads(marker_file.read_text())
    marker_file.write_text(json.dumps({k: marker[k] for k in ("package", "version", "sha256")}))
    (llama_source.path / "src" / "llama-arch.cpp").write_text("// patched\n")
    assert source.read_source(llama_source.path, pin_for(SDIST)) is None
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    sdist = tmp_path / "pkg-1.0.tar.gz"
    again = source.ensure_source(
        paths, source_dir=llama_source.path, sdist=sdist, pin=pin_for(SDIST)
    )
    assert (again.path / "src" / "llama-arch.cpp").read_text() == "// archs\n"
    source.check_unpacked(again)


def test_a_checkout_is_built_as_it_is(tmp_path):
    checkout = tmp_path / "llama.cpp"
    checkout.mkdir()
    (checkout / "CMakeLists.txt").write_text("project(llama)\n")
    found = source.read_source(checkout, pin_for(SDIST))
    assert found is not None and found.origin == "checkout"
    (checkout / "CMakeLists.txt").write_text("project(mine)\n")
    source.check_unpacked(found)  # its identity is what it holds: nothing to compare


# --- the Lucebox engine's tree ----------------------------------------------------------------


@pytest.fixture
def lucebox_source(tmp_path) -> source.SourceInfo:
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    return lucebox.ensure_source(paths, source_dir=tmp_path / "lucebox", tarball=DEFAULT_TARBALL)


@needs_tarball
def test_a_file_changed_under_deps_is_refused_and_the_build_never_starts(lucebox_source, tmp_path):
    lucebox.check_unpacked(lucebox_source)
    changed = lucebox_source.path / DEPS_FILE
    changed.write_bytes(changed.read_bytes() + b"\n// patched\n")
    with pytest.raises(HashMismatchError) as refused:
        kinds.LUCEBOX.check_source(lucebox_source)  # what `engine source` runs
    assert f"1 files differ ({DEPS_FILE} changed)" in refused.value.message
    assert f"the Lucebox engine source {DEFAULT.version}" in refused.value.message
    hint = refused.value.hint or ""
    assert f"delete {lucebox_source.path}" in hint
    assert "`lucebox engine source --engine lucebox`" in hint
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})
    options = BuildOptions("cuda", ("86",), toolkit="system CUDA 13.0", webui=False)
    with pytest.raises(HashMismatchError, match="not the pinned tree any more"):
        luceboxbuild.build_and_install(paths, lucebox_source, options)
    assert [p.name for p in paths.builds_dir.iterdir()] == [".lock"]


@needs_tarball
def test_what_the_digest_leaves_out_may_change(lucebox_source):
    """The BSA submodule is put beside the tree by hand; images are not read by the build."""
    bsa = lucebox_source.path / "server" / "deps" / "Block-Sparse-Attention" / "csrc" / "a.h"
    bsa.parent.mkdir(parents=True)
    bsa.write_text("// submodule\n")
    (lucebox_source.path / "server" / "docs" / "plot.png").write_bytes(b"\x89PNG")
    lucebox.check_unpacked(lucebox_source)


@needs_tarball
def test_a_tree_unpacked_without_a_file_record_is_still_checked(lucebox_source):
    marker_file = lucebox_source.path / MARKER_NAME
    marker = json.loads(marker_file.read_text())
    del marker["files"]
    marker_file.write_text(json.dumps(marker))
    lucebox.check_unpacked(lucebox_source)
    (lucebox_source.path / "server" / "CMakeLists.txt").write_text("project(other)\n")
    with pytest.raises(HashMismatchError, match=f"the pinned tree's {lucebox.PIN.tree_sha256}"):
        lucebox.check_unpacked(lucebox_source)


def test_hash_tree_walks_real_files(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c.txt").write_bytes(b"c")
    (tmp_path / "skip.txt").write_bytes(b"s")
    hashes = sourcetree.hash_tree(tmp_path, lambda p: None if p == "skip.txt" else f"x/{p}")
    assert hashes == {
        "x/a/b/c.txt": "2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6"
    }
    assert Path(tmp_path / "skip.txt").exists()
