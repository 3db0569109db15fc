"""Read speed of one file's page-cache pages through 4 KiB and through 2 MiB mappings.

    python scripts/bench_page_size.py FILE [FILE ...] [--rounds 3] [--gib 3]

Each file is mapped twice in this process: once with ``MADV_NOHUGEPAGE`` (every 4 KiB a
page-table entry) and once with ``MADV_HUGEPAGE``, both populated; the same physical pages
back both, so the two differ only in page size. One thread sums the first ``--gib`` GiB as
int64 words (XOR, so the sum costs less than the read), the two maps in turns, each round.
Prints JSON: GB/s per round and map, and how much of each map the kernel mapped in 2 MiB
pages (smaps' ``FilePmdMapped``: only where the page cache holds 2 MiB folios). Linux
only. docs/cpu-backend.md ("Page size") has what it measured, and what the decode does.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

MADV_POPULATE_READ = 22


def _pmd_kib(m: mmap.mmap) -> int:
    """FilePmdMapped of the mapping that holds ``m``'s first byte."""
    addr = np.frombuffer(m, np.uint8, 1).ctypes.data
    text = Path("/proc/self/smaps").read_text()
    for head in re.finditer(r"^([0-9a-f]+)-([0-9a-f]+) ", text, re.MULTILINE):
        if int(head[1], 16) <= addr < int(head[2], 16):
            found = re.compile(r"^FilePmdMapped:\s+(\d+)", re.MULTILINE).search(text, head.end())
            return int(found[1]) if found else 0
    return 0


def _gbs(m: mmap.mmap, n: int) -> float:
    words = np.frombuffer(m, np.uint8, n).view(np.int64)
    chunk = 1 << 22
    t = time.perf_counter()
    for i in range(0, len(words), chunk):
        np.bitwise_xor.reduce(words[i:i + chunk])
    return n / (time.perf_counter() - t) / 1e9


def measure(path: str, rounds: int, gib: float) -> dict[str, object]:
    with open(path, "rb") as f:
        maps = {}
        for name, advice in (("4k", mmap.MADV_NOHUGEPAGE), ("2m", mmap.MADV_HUGEPAGE)):
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            m.madvise(advice)
            m.madvise(MADV_POPULATE_READ)
            maps[name] = m
    n = min(len(maps["4k"]), int(gib * (1 << 30))) // 8 * 8
    runs: dict[str, list[float]] = {name: [] for name in maps}
    for _ in range(rounds):
        for name, m in maps.items():
            runs[name].append(round(_gbs(m, n), 3))
    return {"file": os.path.basename(path), "bytes_read": n,
            "pmd_mapped_kib": {name: _pmd_kib(m) for name, m in maps.items()},
            "gb_per_s": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gib", type=float, default=3.0)
    a = p.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("Linux only: it reads /proc/self/smaps and uses Linux's madvise advice.")
    json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "files": [measure(f, a.rounds, a.gib) for f in a.files]}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
