"""The Lucebox engine's disk prefix cache as the planner passes it: a folder per model file,
engine build, KV type and context; a budget from the free disk; off where it cannot work."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lucebox.engine.core.prefixstore import BUDGET_CAP_BYTES, PrefixKey
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.plan.lucebox.diskcache import DiskCacheRequest, plan_disk_cache
from lucebox.engine.plan.lucebox.luceboxlaunch import disk_cache_argv

KEY = PrefixKey("/m/qwen.gguf", 16 * GIB, 1, "/e/dflash_server@9:1", "q4_0", "q4_0", 65536)


def request(**changes: Any) -> DiskCacheRequest:
    return dataclasses.replace(DiskCacheRequest("/c/prefix", KEY, 400 * GIB), **changes)


@pytest.mark.parametrize(
    ("free_bytes", "budget_mib"),
    [(400 * GIB, 64 * 1024), (100 * GIB, 25 * 1024), (8 * GIB, 2 * 1024)],
)
def test_the_budget_is_a_quarter_of_the_free_disk_at_most_64_gib(free_bytes, budget_mib):
    disk = plan_disk_cache(request(free_bytes=free_bytes))
    assert disk.budget_mib == budget_mib
    assert disk_cache_argv(disk) == [
        "--kv-cache-dir", f"/c/prefix/{KEY.folder_name}",
        "--kv-cache-budget", str(budget_mib),
        "--kv-cache-min-tokens", "1024",
        "--disk-prefix-cache", "auto",
    ]  # fmt: skip
    assert disk.budget_mib <= BUDGET_CAP_BYTES // MIB


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"free_bytes": 7 * GIB}, "below 2 GiB"),
        ({"paged_attention": True}, "paged attention turns the engine's snapshots off"),
        ({"wanted": False}, "--cache off"),
    ],
)
def test_not_passed_where_it_cannot_work_and_the_plan_says_why(changes, why):
    disk = plan_disk_cache(request(**changes))
    assert disk.folder is None and disk_cache_argv(disk) == []
    assert disk.reason.startswith("off: ") and why in disk.reason


@pytest.mark.parametrize(
    "other",
    [
        {"engine_build": "/e/dflash_server@10:2"},
        {"cache_type_k": "q8_0", "cache_type_v": "q8_0"},
        {"ctx": 32768},
        {"model_mtime_ns": 2},
    ],
)
def test_another_build_kv_type_context_or_model_file_gets_another_folder(other):
    """The engine's own key leaves the build out: only another folder keeps another build's
    state from being read."""
    elsewhere = plan_disk_cache(request(key=dataclasses.replace(KEY, **other)))
    here = plan_disk_cache(request())
    assert elsewhere.folder is not None and here.folder is not None
    assert elsewhere.folder != here.folder
    assert KEY.folder_name.startswith("qwen-")
