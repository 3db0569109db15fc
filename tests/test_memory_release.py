"""Once a model's kernels are loaded, the compiler's code pages (numba's LLVM) leave the
process's resident memory; a later compile faults them in again and works."""

import sys
from pathlib import Path

import pytest

from inference.backends.base import _glibc, _is_library, library_spans, release_library_pages

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or _glibc() is None, reason="smaps, glibc's madvise")


def read_only_resident_kb(prefix: str) -> int:
    """Resident kB of this process's read-only mappings of libraries named ``prefix``..."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            name = head[5].rsplit("/", 1)[-1] if len(head) > 5 else ""
            inside = name.startswith(prefix) and "w" not in head[1]
        elif inside and head[:1] == ["Rss:"]:
            total += int(head[1])
    return total


def compile_one(constant: int) -> int:
    """A new function through numba's LLVM (never cached): runs the compiler's code."""
    import numba

    @numba.njit(cache=False)
    def add(x):
        return x + constant

    return add(1)


def test_the_compilers_pages_go_and_come_back_when_used():
    assert compile_one(2) == 3
    before = read_only_resident_kb("libllvmlite")
    assert before > 4 << 10  # the compiler ran: megabytes of its code are resident
    released = release_library_pages()
    after = read_only_resident_kb("libllvmlite")
    assert released >= (before - after) << 10 > 0
    assert after < before // 4
    assert compile_one(5) == 6  # the library works again, its pages read from the file
    assert read_only_resident_kb("libllvmlite") > after


def test_a_library_not_named_keeps_its_pages():
    before = read_only_resident_kb("libpython")
    release_library_pages(("libllvmlite",))
    assert read_only_resident_kb("libpython") >= before * 0.9


def test_a_process_releases_the_pages_at_its_first_load_only(monkeypatch):
    """A later load would only drop pages the earlier model's first run faulted in again
    (kernels loaded at their first call), which its next reply faults in once more."""
    import inference
    import inference.api as api

    calls = []
    monkeypatch.setattr(api, "release_library_pages", lambda: calls.append(1) or 0)
    monkeypatch.setattr(api, "_library_pages_released", False)
    for _ in range(2):
        inference.load_model("tests/goldens/tiny/llama", backend="cpu").close()
    assert calls == [1]


def test_every_librarys_unused_pages_go_and_come_back_when_used():
    """With no names given, every shared library's clean pages go (NumPy's here), and the
    library works again; a mapped file that is no library keeps its pages."""
    import mmap

    import numpy as np

    assert float(np.sqrt(np.arange(1000.0)).sum()) > 0  # NumPy's code runs: pages resident
    before = read_only_resident_kb("_multiarray_umath")
    assert before > 256
    with open(__file__, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    data_resident = sum(data[i] for i in range(0, len(data), 4096)) and \
        read_only_resident_kb(Path(__file__).name)
    release_library_pages()
    assert read_only_resident_kb("_multiarray_umath") < before // 2
    assert read_only_resident_kb(Path(__file__).name) == data_resident > 0
    assert float(np.sqrt(np.arange(1000.0)).sum()) > 0
    data.close()


def test_a_load_maps_the_packed_store_in_after_the_libraries_pages_go(monkeypatch):
    """The load's peak holds the store's pages or the compiler's and the load's temporaries,
    not both: the store is populated last, after the libraries' pages went."""
    import inference
    import inference.api as api
    from inference.backends.cpu import pack

    calls = []
    monkeypatch.setattr(api, "release_library_pages", lambda: calls.append("release") or 0)
    monkeypatch.setattr(api, "_library_pages_released", False)
    monkeypatch.setattr(pack.PackStore, "populate", lambda self: calls.append("populate"))
    inference.load_model("tests/goldens/tiny/phi3_q4_0.gguf", backend="cpu").close()
    assert calls == ["release", "populate"]


def spans_line_by_line(smaps: str, prefixes=None) -> list[tuple[int, int, int]]:
    """The mappings release_library_pages releases, read line by line (its earlier parse)."""
    spans, start, end, rss, wanted = [], 0, 0, 0, False
    for line in smaps.splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            lo, hi = head[0].split("-")
            start, end = int(lo, 16), int(hi, 16)
            name = head[5].rsplit("/", 1)[-1] if len(head) > 5 else ""
            wanted = "w" not in head[1] and _is_library(name) and (
                prefixes is None or name.startswith(tuple(prefixes)))
            rss = 0
        elif wanted and head[:1] == ["Rss:"]:
            rss = int(head[1]) << 10
        elif wanted and head[:1] == ["Anonymous:"] and head[1] == "0" and rss:
            spans.append((start, end, rss))
    return spans


SMAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 11   /usr/lib/liba.so.6
Size:                  4 kB
Rss:                   4 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
7f0000001000-7f0000003000 r-xp 00001000 08:01 11   /usr/lib/liba.so.6
Size:                  8 kB
Rss:                   8 kB
Anonymous:             0 kB
7f0000003000-7f0000004000 r--p 00003000 08:01 11   /usr/lib/liba.so.6
Rss:                   4 kB
Anonymous:             4 kB
7f0000004000-7f0000005000 rw-p 00004000 08:01 11   /usr/lib/liba.so.6
Rss:                   4 kB
Anonymous:             0 kB
7f0000005000-7f0000006000 r-xp 00000000 08:01 12   /opt/x/libb.so (deleted)
Rss:                   4 kB
Anonymous:             0 kB
7f0000006000-7f0000008000 r-xp 00000000 08:01 13   /opt/x/libc.so
Rss:                   0 kB
Anonymous:             0 kB
7f0000008000-7f0000009000 r--p 00000000 08:01 14   /data/model.gguf
Rss:                   4 kB
Anonymous:             0 kB
7f0000009000-7f000000a000 r-xp 00000000 08:01 15   /opt/x/libsomething.sox
Rss:                   4 kB
Anonymous:             0 kB
7f000000a000-7f000000c000 rw-p 00000000 00:00 0 \n\
Rss:                   8 kB
Anonymous:             8 kB
7f000000c000-7f000000d000 r-xp 00000000 08:01 16   /opt/x/libd.so.1.2
Size:                  4 kB
Rss:                   4 kB
Anonymous:             0 kB
"""


def test_the_mappings_released_are_those_a_line_by_line_reading_finds():
    """Read-only, resident, no private copy, a library's (by its file name, prefixes):
    on a made-up smaps and on this process's own."""
    assert library_spans(SMAPS) == [(0x7F0000000000, 0x7F0000001000, 4096),
                                    (0x7F0000001000, 0x7F0000003000, 8192),
                                    (0x7F0000005000, 0x7F0000006000, 4096),
                                    (0x7F000000C000, 0x7F000000D000, 4096)]
    for prefixes in (None, ("liba",), ("libb", "libd"), ("libz",)):
        assert library_spans(SMAPS, prefixes) == spans_line_by_line(SMAPS, prefixes)
    own = Path("/proc/self/smaps").read_text()
    assert library_spans(own) == spans_line_by_line(own) != []
    assert library_spans(own, ("libpython",)) == spans_line_by_line(own, ("libpython",))
