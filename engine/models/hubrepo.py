"""A GGUF repo on the Hugging Face Hub by name: its files at a pinned revision, one header read
by range requests, and the Hub's search for GGUF repos.

huggingface-hub answers the metadata (``model_info(files_metadata=True)``: sizes, LFS sha256,
the commit) and the search (``list_models``); the header is read through huggingface-hub's own
HTTP session with closed ``Range`` requests, a megabyte at a time, so the choice of a quant
costs a few megabytes however large the files are. Every quant of a repo shares the shapes, so
one header serves them all; each quant's weight bytes come from its file size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.models import quant
from lucebox.engine.models.gguf import GgufFormatError, GgufHeader, parse_header
from lucebox.engine.models.headerinfo import ModelInfo, info_from_header
from lucebox.engine.models.hubpull import hub_endpoint, hub_error, hub_offline
from lucebox.engine.models.modelsource import ModelSource
from lucebox.engine.models.records import StoreError

HTTP_TIMEOUT_S = 30.0
SEARCH_LIMIT = 20


class HubUnreachableError(StoreError):
    """The Hub did not answer (no network, HF_HUB_OFFLINE): not a verdict on the repo."""


def _unreachable_or(exc: Exception, source: ModelSource) -> StoreError:
    from huggingface_hub.errors import HfHubHTTPError

    mapped = hub_error(exc, source)
    if isinstance(exc, HfHubHTTPError):
        return StoreError(mapped.message, hint=mapped.hint)
    return HubUnreachableError(mapped.message, hint=mapped.hint)


@dataclass(frozen=True)
class RepoListing:
    """A repo's GGUFs at one commit: the quant candidates and what lies beside them."""

    repo_id: str
    revision: str
    """The commit every file of the choice is downloaded from."""
    gated: bool
    layout: quant.RepoLayout

    def source_for(self, group: quant.QuantGroup) -> str:
        """The pinned file source the store pulls (the first shard names the rest)."""
        return f"hf:{self.repo_id}/{group.first.path}@{self.revision}"


@dataclass(frozen=True)
class RemoteHeader:
    """The header of one quant, read from the Hub: the shapes every quant shares."""

    info: ModelInfo
    quant: str
    size_bytes: int
    """The bytes of the files the header describes (all shards)."""
    bytes_read: int


@dataclass(frozen=True)
class RepoHit:
    """One search result."""

    repo_id: str
    downloads: int
    likes: int
    gated: bool
    updated: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "repo": self.repo_id,
            "downloads": self.downloads,
            "likes": self.likes,
            "gated": self.gated,
            "updated": self.updated,
        }


def _offline_refusal(source: ModelSource) -> StoreError:
    return HubUnreachableError(
        f"{source.text} names a repo on the Hub, and HF_HUB_OFFLINE is set",
        hint="unset HF_HUB_OFFLINE, or name a file already pulled (`lucebox models list`)",
    )


def list_repo(source: ModelSource) -> RepoListing:
    """The GGUFs of ``source``'s repo, grouped, at its newest commit (or ``@REVISION``)."""
    from huggingface_hub import HfApi

    if hub_offline():
        raise _offline_refusal(source)
    try:
        info = HfApi(endpoint=hub_endpoint()).model_info(
            source.repo_id, revision=source.revision, files_metadata=True
        )
    except Exception as exc:
        raise _unreachable_or(exc, source) from exc
    files = [
        quant.RepoFile(s.rfilename, int(s.size or 0), s.lfs.sha256 if s.lfs else None)
        for s in info.siblings or []
    ]
    found = quant.layout(files)
    if not found.candidates:
        raise StoreError(
            f"{source.repo_id} holds no GGUF model file"
            + (f" ({'; '.join(found.skipped)})" if found.skipped else ""),
            hint="`lucebox models search TEXT` lists repos that do",
        )
    return RepoListing(
        source.repo_id, info.sha or source.revision or "main", bool(info.gated), found
    )


def repo_files(
    repo_id: str, *, timeout_s: float | None = None
) -> tuple[str, dict[str, str | None]]:
    """The newest commit of ``repo_id`` and each file's LFS sha256 there (None for a file kept
    in git): one request. :class:`HubUnreachableError` when the Hub does not answer."""
    from huggingface_hub import HfApi

    source = ModelSource("repo", repo_id, repo_id=repo_id)
    if hub_offline():
        raise HubUnreachableError(
            f"HF_HUB_OFFLINE is set: {repo_id} on the Hub cannot be read",
            hint="unset HF_HUB_OFFLINE to check it",
        )
    try:
        info = HfApi(endpoint=hub_endpoint()).model_info(
            repo_id, files_metadata=True, timeout=timeout_s
        )
    except Exception as exc:
        raise _unreachable_or(exc, source) from exc
    files = {s.rfilename: (s.lfs.sha256 if s.lfs else None) for s in info.siblings or []}
    return info.sha or "main", files


class _RangeFile:
    """A read-only, seekable view of a Hub file; each read is one closed Range request."""

    def __init__(self, url: str, size: int, headers: dict[str, str], source: ModelSource):
        self.url, self.size, self.headers, self.source = url, size, headers, source
        self.pos = 0
        self.bytes_read = 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def read(self, n: int = -1) -> bytes:
        from huggingface_hub import get_session, hf_raise_for_status

        end = self.size if n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        headers = {**self.headers, "Range": f"bytes={self.pos}-{end - 1}"}
        try:
            response = get_session().get(self.url, headers=headers, timeout=HTTP_TIMEOUT_S)
            hf_raise_for_status(response)
        except Exception as exc:
            raise _unreachable_or(exc, self.source) from exc
        data = response.content
        if response.status_code != 206:
            # A server without ranges sends the whole file; keep only what was asked.
            data = data[self.pos : end]
        self.pos += len(data)
        self.bytes_read += len(data)
        return data


@dataclass(frozen=True)
class _Parsed:
    header: GgufHeader
    bytes_read: int


def _read_one(listing: RepoListing, item: quant.RepoFile, source: ModelSource) -> _Parsed:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    url = hf_hub_url(listing.repo_id, item.path, revision=listing.revision, endpoint=hub_endpoint())
    handle = _RangeFile(url, item.size_bytes, build_hf_headers(), source)
    try:
        header = parse_header(handle, item.size_bytes)
    except GgufFormatError as exc:
        raise StoreError(
            f"{listing.repo_id}/{item.path} is not a readable GGUF: {exc.message}",
            hint="name another quant of the repo with :QUANT",
        ) from exc
    return _Parsed(header, handle.bytes_read)


def read_file_header(listing: RepoListing, item: quant.RepoFile, source: ModelSource) -> GgufHeader:
    """The header of one file of the repo (a sidecar's), by range requests."""
    return _read_one(listing, item, source).header


def read_header(listing: RepoListing, source: ModelSource) -> RemoteHeader:
    """The header of one quant, by range requests: a single-file quant when there is one (the
    smallest), else every shard's header of the smallest split quant (the tensors are spread
    over the shards; the metadata is in the first)."""
    groups = listing.layout.candidates
    singles = [g for g in groups if len(g.files) == 1]
    group = min(singles or list(groups), key=lambda g: g.size_bytes)
    parsed = [_read_one(listing, item, source) for item in group.files]
    first = parsed[0].header
    tensors = tuple(t for p in parsed for t in p.header.tensors)
    merged = GgufHeader(
        first.version,
        first.metadata,
        tensors,
        first.data_offset,
        first.alignment,
        sum(p.bytes_read for p in parsed),
    )
    url = f"hf:{listing.repo_id}/{group.first.path}@{listing.revision}"
    try:
        info = info_from_header(merged, url, group.size_bytes)
    except GgufFormatError as exc:
        raise StoreError(f"{url}: {exc.message}", hint="name another quant with :QUANT") from exc
    return RemoteHeader(info, group.quant, group.size_bytes, merged.bytes_read)


def search(text: str, *, limit: int = SEARCH_LIMIT) -> list[RepoHit]:
    """GGUF repos whose name matches ``text``, the most downloaded first."""
    from huggingface_hub import HfApi

    source = ModelSource("repo", text, repo_id=text)
    if hub_offline():
        raise HubUnreachableError(
            "searching the Hub needs the network, and HF_HUB_OFFLINE is set",
            hint="unset HF_HUB_OFFLINE; `lucebox models list --all` shows the models on disk",
        )
    try:
        models = list(
            HfApi(endpoint=hub_endpoint()).list_models(
                search=text, filter="gguf", sort="downloads", limit=limit
            )
        )
    except LuceboxError:
        raise
    except Exception as exc:
        raise hub_error(exc, source) from exc
    return [
        RepoHit(
            m.id,
            int(m.downloads or 0),
            int(m.likes or 0),
            bool(m.gated),
            m.last_modified.isoformat() if m.last_modified else None,
        )
        for m in models
    ]


def repo_ids(text: str) -> list[str]:
    """The ids of :func:`search`'s repos, as short names look them up."""
    return [hit.repo_id for hit in search(text)]
