"""Benchmark: `lucebox models pull` from a loopback Hub vs plain curl of the same file.

Serves one GGUF (a real header plus --size-mib of tensor data) from the local Hub test server
and times, --rounds times alternately, `curl -o` and the whole `lucebox models pull` command
(Python start-up, Hub metadata, download with hashing, header check, record). Reports median
MiB/s of each, their ratio, and the bytes the lucebox process read from files (rchar; socket
reads are not counted) over the file size: hashing happens while writing, with no second pass.
Also times curl followed by `sync FILE`, since lucebox makes its file durable before the rename
and plain curl does not: where the disk's durable write rate is below the network's, that rate
bounds a download that must survive a power cut. `--dir /dev/shm` puts both files in memory,
which compares the download paths themselves.

The default size is 4 GiB, below any real model (5 to 40 GB) but above what the page cache
takes in without writing back (dirty_ratio of memory): a file that fits there measures the page
cache rather than the download, and plain curl looks faster than any durable write can be.

    .venv/bin/python -m benchmarks.pull_throughput [--size-mib 4096] [--rounds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support.ggufgen import ModelSpec, write_llama
from support.hubserver import HubFile, serve_hub

_PULL = """
import sys
from lucebox.app.cli.parser import main
code = main(["models", "pull", sys.argv[1]])
io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
print("RCHAR", io["rchar"], file=sys.stderr)
sys.exit(code)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where both downloads land (default: the temp dir); /dev/shm takes the disk out",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        work = Path(folder)
        # One big F16 layer stack gives a valid GGUF of about the requested size.
        n_embd = 1024
        n_layer = max(1, args.size_mib * 2**20 // (2 * (4 * n_embd * n_embd + 3 * n_embd * 4096)))
        model = write_llama(
            work / "bench-instruct-f16.gguf",
            ModelSpec(n_layer=n_layer, n_embd=n_embd, n_ff=4096, n_head=16, n_head_kv=16),
        )
        body = model.read_bytes()
        model.unlink()
        with serve_hub() as hub:
            hub.add("benchmarks/model", "bench-instruct-f16.gguf", HubFile(body))
            url = f"{hub.base_url}/bench/model/resolve/main/bench-instruct-f16.gguf"
            curl_times, curl_synced_times, pull_times, rchars = [], [], [], []
            for round_no in range(args.rounds):
                started = time.perf_counter()
                subprocess.run(["curl", "-sSfL", "-o", str(work / "curl.gguf"), url], check=True)
                curl_times.append(time.perf_counter() - started)
                # lucebox syncs its file before calling it done; curl leaves it to the kernel.
                subprocess.run(["sync", str(work / "curl.gguf")], check=True)
                curl_synced_times.append(time.perf_counter() - started)
                (work / "curl.gguf").unlink()
                env = {
                    **os.environ,
                    "HF_ENDPOINT": hub.base_url,
                    "LUCEBOX_HOME": str(work / f"home-{round_no}"),
                    "HF_HOME": str(work / "hf"),
                }
                started = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", _PULL, "hf:benchmarks/model/bench-instruct-f16.gguf"],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                pull_times.append(time.perf_counter() - started)
                if done.returncode != 0:
                    raise SystemExit(done.stderr)
                rchars.append(int(done.stderr.split("RCHAR")[-1].split()[0]))
                shutil.rmtree(work / f"home-{round_no}")
    curl_s, synced_s, pull_s, rchar = (
        statistics.median(v) for v in (curl_times, curl_synced_times, pull_times, rchars)
    )
    size_mib = len(body) / 2**20
    print(
        json.dumps(
            {
                "file_mib": round(size_mib, 1),
                "curl_mib_per_s": round(size_mib / curl_s, 1),
                "lucebox_pull_mib_per_s": round(size_mib / pull_s, 1),
                "ratio": round(curl_s / pull_s, 3),
                "curl_then_sync_mib_per_s": round(size_mib / synced_s, 1),
                "ratio_to_curl_then_sync": round(synced_s / pull_s, 3),
                "lucebox_rchar_over_file_size": round(rchar / len(body), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
