"""Benchmark: a loopback download cut 5 times against the same download uninterrupted.

Serves --size-mib of bytes from the local Hub test server and downloads them with the real
transfer (hash while writing, fsync before the rename, default retry settings), alternately
whole and with --cuts connections closed mid-body at even offsets. Each cut is resumed within
the run after the backoff wait (1 s after an attempt that brought new bytes). Reports the median
seconds of each, the waits, and ``(cut - waits) / whole``: the issue's bar is 1.2.

    .venv/bin/python -m benchmarks.download_resumes [--size-mib 4096] [--cuts 5] [--rounds 2]
        [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from lucebox.engine.core.download import download_file
from lucebox.engine.core.downloadprogress import TransferProgress
from support.hubserver import HubFile, cut, serve_hub

BLOCK_BYTES = 16 * 2**20


def _timed_download(url: str, dest: Path, sha256: str, size_bytes: int) -> tuple[float, float]:
    """Seconds the download took and seconds of it spent waiting to retry."""
    waits_s: dict[int, float] = {}

    def note_wait(event: TransferProgress) -> None:
        if event.waiting_s is not None:
            waits_s.setdefault(event.attempt, event.waiting_s)

    started = time.perf_counter()
    download_file(url, dest, sha256=sha256, size_bytes=size_bytes, on_progress=note_wait)
    elapsed_s = time.perf_counter() - started
    dest.unlink()
    return elapsed_s, sum(waits_s.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--cuts", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where the downloads land")
    args = parser.parse_args()
    size_bytes = args.size_mib * 2**20
    # Repeated random blocks: incompressible enough for loopback, cheap to build at 4 GiB.
    body = os.urandom(BLOCK_BYTES) * (size_bytes // BLOCK_BYTES) + os.urandom(
        size_bytes % BLOCK_BYTES
    )
    sha256 = hashlib.sha256(body).hexdigest()
    step_bytes = size_bytes // (args.cuts + 1)
    whole_s: list[float] = []
    cut_s: list[float] = []
    waits_s: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as folder, serve_hub() as hub:
        hub_file = hub.add("benchmarks/model", "bench.bin", HubFile(body))
        url = f"{hub.base_url}/bench/model/resolve/main/bench.bin"
        for _ in range(args.rounds):
            hub_file.faults = []
            elapsed_s, _ = _timed_download(url, Path(folder) / "whole.bin", sha256, size_bytes)
            whole_s.append(elapsed_s)
            hub_file.faults = [cut(step_bytes) for _ in range(args.cuts)]
            elapsed_s, waited_s = _timed_download(url, Path(folder) / "cut.bin", sha256, size_bytes)
            cut_s.append(elapsed_s)
            waits_s.append(waited_s)
        gets = [r for r in hub.requests if r[0] == "GET"]
    whole = statistics.median(whole_s)
    cut_median = statistics.median(cut_s)
    waited = statistics.median(waits_s)
    print(
        json.dumps(
            {
                "size_mib": args.size_mib,
                "cuts": args.cuts,
                "rounds": args.rounds,
                "whole_s": [round(t, 2) for t in whole_s],
                "cut_s": [round(t, 2) for t in cut_s],
                "waits_s": [round(t, 2) for t in waits_s],
                "whole_median_s": round(whole, 2),
                "cut_median_s": round(cut_median, 2),
                "whole_mib_per_s": round(args.size_mib / whole, 1),
                "ratio_without_waits": round((cut_median - waited) / whole, 3),
                "requests": len(gets),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
