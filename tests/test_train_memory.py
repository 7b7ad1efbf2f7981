"""The trainer's heap trimming gives freed CPU tensor memory back to the OS (glibc)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

SCRIPT = """
import torch
from nyscli.train.resources import release_free_heap

def rss_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024

big = torch.ones(2 << 20)
del big  # freeing an 8 MB mmap block makes glibc serve blocks up to 8 MB from the heap
blocks = [torch.ones(1 << 20) for _ in range(100)]  # 100 x 4 MB, now from the heap
keep = blocks[-1]  # a live block at the heap's end: without a trim nothing goes back
del blocks
before = rss_mb()
release_free_heap()
print(before - rss_mb())
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or "libc" not in str(ctypes.util.find_library("c")),
    reason="malloc_trim is glibc's",
)
def test_release_free_heap_returns_freed_tensors_to_the_os():
    # A fresh interpreter, so the heap holds exactly what the script allocated.
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    released_mb = float(out.stdout)
    assert released_mb > 300, f"only {released_mb:.0f} MB of ~396 MB freed came back"
