"""The Lucebox engine's disk prefix cache as the stand-in (support/luceboxfake.py) models it.

Recorded from the pinned source (``server_main.cpp``, ``disk_prefix_cache.cpp``,
``http_server.cpp`` at 4cf58a04): the flags and their parsing, the folder layout
``<dir>/<layout id>/<tokens' hash>.dkv`` with its 80-byte header, the lookups of policy
``auto`` (every chat boundary, longest first, with no recent prompt to compare; else the
prefix shared with the recent prompts, prefilled and saved when not on disk), the save at
shutdown of the tracked prompt, and the lines it logs. The layout id is the engine's salt
(model path, size, modification time, context, chat template) folded with what stands for
the snapshot's tensors here: the K and V types. Like the real engine it does not know its own
build: a state saved by another build in the same folder would be found. A token is four
characters of the messages (the stand-in's rule); a chat boundary is the end of a message.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

STAGING_SLOT = 63
"""``kDiskStagingSlot``: ``ModelBackend::kMaxSlots - 1``."""
POLICY_ERROR = (
    "[server] --disk-prefix-cache must be off, full, auto, auto:<window>, or a positive token count"
)
PAGED_LINE = (
    "[server] --paged-attention disables prefix/prefill snapshots until their format stores "
    "page tables"
)
PAYLOAD_BYTES_PER_TOKEN = 64


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_policy(value: str) -> str | None:
    """``parse_disk_prefix_cache_policy``: the policy's name as the engine logs it, or None."""
    v = value.lower()
    if v in ("off", "none", "disabled"):
        return "off"
    if v in ("full", "full-prefix"):
        return "full"
    if v == "auto":
        return "auto:30"
    number = v.removeprefix("auto:")
    if not number.isdigit() or not 0 < int(number) <= 1_000_000:
        return None
    return f"auto:{int(number)}" if v.startswith("auto:") else f"fixed:{int(number)}"


def atoi(text: str) -> int:
    """C's ``atoi``: the leading integer, 0 when there is none."""
    found = re.match(r"\s*([+-]?\d+)", text)
    return int(found.group(1)) if found else 0


def configure(options: list[str]) -> DiskCache | int:
    """The disk cache the options set up as the engine's parser reads them (a flag's value
    only when one follows it), or the exit status of a policy it refuses."""
    disk = DiskCache()
    for i, option in enumerate(options[:-1]):
        value = options[i + 1]
        if option == "--kv-cache-dir":
            disk.folder = value
        elif option == "--kv-cache-budget":
            disk.budget_mb = atoi(value)
        elif option == "--kv-cache-min-tokens":
            disk.min_tokens = atoi(value)
        elif option == "--disk-prefix-cache":
            policy = parse_policy(value)
            if policy is None:
                say(POLICY_ERROR)
                return 2
            disk.policy = policy
    if "--paged-attention" in options:
        say(PAGED_LINE)
        disk.folder, disk.policy = "", "off"
    return disk


@dataclass
class DiskCache:
    folder: str = ""
    budget_mb: int = 4096
    min_tokens: int = 512
    policy: str = "full"
    layout: str = ""
    layout_dir: str = ""
    recent: list[list[str]] = field(default_factory=list)
    tracked: list[str] = field(default_factory=list)

    @property
    def on(self) -> bool:
        return bool(self.folder) and self.policy != "off"

    def start(self, model: str, max_ctx: int, kv_types: str) -> None:
        """``set_identity_salt`` and ``init``: the layout from the files on disk, if any."""
        self.layout = _layout_id(model, max_ctx, kv_types)
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        for sub in sorted(p for p in Path(self.folder).iterdir() if p.is_dir()):
            if any(_header(f) for f in sub.glob("*.dkv")):
                self.layout_dir = str(sub)
                self._scan()
                break
        known = Path(self.layout_dir).name if self.layout_dir else "pending"
        say(
            f"[disk-cache] initialized dir={self.folder} budget="
            f"{self.budget_mb / 1024:.1f} GB layout={known}"
        )

    def chat(self, messages: list[str], reply_id: str) -> None:
        """The disk lookups and saves of one chat request, and its ``chat CACHE`` line."""
        ends = _boundaries(messages)
        prompt = ends[-1] if ends else 0
        hit = 0
        if self.on:
            hit = self._lookup(messages, ends)
        self.recent.insert(0, messages)
        self.tracked = messages
        say(
            f"[server] chat CACHE {reply_id} restore={'true' if hit else 'false'} "
            f"slot={STAGING_SLOT if hit else -1} prefix_len={hit} effective_prompt={prompt} "
            f"pflash=false disk_policy={self.policy} disk_hit={'true' if hit else 'false'} "
            f"snap_slot=0 snap_pos={prompt} full_snap_slot=-1 full_snap_pos=0"
        )

    def shutdown(self) -> None:
        if self.on and self.tracked:
            say("[disk-cache] shutdown: saving 1 tracked slots")
            self._save(self.tracked)

    def _lookup(self, messages: list[str], ends: list[int]) -> int:
        count = len(messages)
        lengths = [k for k in range(count, 0, -1) if ends[k - 1] >= self.min_tokens]
        shared = max((_common(messages, r) for r in self.recent[:30]), default=0)
        if self.policy.startswith("auto") and shared and ends[shared - 1] >= self.min_tokens:
            lengths = [shared]
        for k in lengths:
            if self._read(messages[:k]):
                say(
                    f"[disk-cache] hit policy={self.policy} len={ends[k - 1]} "
                    f"slot={STAGING_SLOT} pos={ends[k - 1]}"
                )
                return ends[k - 1]
        if lengths == [shared] and shared:
            say(f"[disk-cache] scoped prefix: policy={self.policy} boundary={ends[shared - 1]}")
            saved = self._save(messages[:shared])
            say(
                f"[disk-cache] scoped prefix {'saved' if saved else 'staged'}, restoring from "
                f"{ends[shared - 1]}"
            )
            return ends[shared - 1]
        return 0

    def _read(self, messages: list[str]) -> bool:
        if not self.layout_dir:
            return False
        path = Path(self.layout_dir) / f"{_hash(messages)}.dkv"
        if not path.is_file():
            return False
        header = _header(path)
        if header is None or not _whole(path):
            say(f"[disk-cache] lookup failed, removing {path}")
            path.unlink(missing_ok=True)
            return False
        if Path(self.layout_dir).name != self.layout:
            say(f"[disk-cache] adopted layout mismatch: disk={header} model={self.layout}")
            self.layout_dir = f"{self.folder}/{self.layout}"
            self._scan()
            return False
        return True

    def _save(self, messages: list[str]) -> bool:
        tokens = _boundaries(messages)[-1]
        if tokens < self.min_tokens:
            return False
        if Path(self.layout_dir).name != self.layout:
            self.layout_dir = f"{self.folder}/{self.layout}"
            Path(self.layout_dir).mkdir(parents=True, exist_ok=True)
            say(f"[disk-cache] layout learned: {self.layout}")
            self._scan()
        token_hash = _hash(messages)
        path = Path(self.layout_dir) / f"{token_hash}.dkv"
        if path.is_file():
            return True
        now = int(time.time())
        header = b"DKVC" + struct.pack("<I", 1) + bytes.fromhex(self.layout)
        header += struct.pack("<III", tokens, 1, tokens) + bytes.fromhex(token_hash)
        header += struct.pack("<QQQi", tokens * PAYLOAD_BYTES_PER_TOKEN, now, now, 0)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(header + bytes(tokens * PAYLOAD_BYTES_PER_TOKEN))
        os.replace(tmp, path)
        size_mb = path.stat().st_size / (1024 * 1024)
        say(f"[disk-cache] saved {token_hash} ({tokens} tokens, {tokens} pos, {size_mb:.1f} MB)")
        return True

    def _scan(self) -> None:
        files = [f for f in Path(self.layout_dir).glob("*.dkv") if _header(f)]
        size_mb = sum(f.stat().st_size for f in files) / (1024 * 1024)
        say(f"[disk-cache] scanned {len(files)} files, {size_mb:.1f} MB")


def _layout_id(model: str, max_ctx: int, kv_types: str) -> str:
    """``compute_disk_cache_salt`` folded with the snapshot's tensors (here its KV types)."""
    try:
        stat = os.stat(model)
        size, mtime = stat.st_size, int(stat.st_mtime)
    except OSError:
        size = mtime = 0
    path = model.encode()
    salt_input = struct.pack("<I", len(path)) + path + struct.pack("<qqi", size, mtime, max_ctx)
    salt_input += hashlib.sha1(b"").digest()
    salt = hashlib.sha1(salt_input).digest()[:16]
    return hashlib.sha1(salt + kv_types.encode()).hexdigest()[:32]


def _boundaries(messages: list[str]) -> list[int]:
    ends, chars = [], 0
    for text in messages:
        chars += len(text)
        ends.append(chars // 4)
    return ends


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _hash(messages: list[str]) -> str:
    return hashlib.sha1(json.dumps(messages).encode()).hexdigest()[:32]


def _whole(path: Path) -> bool:
    """Whether the file holds all the tensor bytes its header promises (``read_file``)."""
    head = path.read_bytes()[:80]
    (payload,) = struct.unpack_from("<Q", head, 52)
    return path.stat().st_size >= 80 + payload


def _header(path: Path) -> str | None:
    """The layout id of a whole 80-byte header with the engine's magic, or None."""
    try:
        with path.open("rb") as f:
            head = f.read(80)
    except OSError:
        return None
    if len(head) < 80 or head[:4] != b"DKVC":
        return None
    return head[8:24].hex()
