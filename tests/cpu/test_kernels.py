"""attnlab.cpu.kernels: handing the model over to another thread (the OpenMP workers of the
thread that let go are freed). The kernels themselves: test_linear.py, test_int_kernels.py,
test_decode_attention.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from attnlab.cpu.kernels import _openmp_runtime

SCRIPT = r"""
import os, time, torch
from attnlab.cpu.kernels import hand_over_threads

def threads():
    return len(os.listdir("/proc/self/task"))

torch.set_num_threads(2)
big = torch.ones(1 << 22)
(big + 1).sum()  # a parallel region on this thread: its pool of workers
before = threads()
done = hand_over_threads()
deadline = time.monotonic() + 30  # the workers leave the pool, then their threads end
while threads() >= before and time.monotonic() < deadline:
    time.sleep(0.01)
after = threads()
(big + 1).sum()  # a new region on this thread makes a new pool
again = threads()
print(done, before, after, again)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="torch runs no OpenMP")
@pytest.mark.skipif("gomp" not in os.path.basename(_openmp_runtime() or ""),
                    reason="hand_over_threads frees GNU OpenMP's workers (torch here runs "
                           "another OpenMP)")
def test_handing_over_frees_the_calling_threads_openmp_workers():
    """The engine's thread must be the only one with OpenMP workers (else GNU OpenMP stops
    them spinning and every parallel region waits for them to wake): after
    hand_over_threads() the process has fewer threads, and the caller's next parallel region
    makes its pool again."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    done, before, after, again = out[0] == "True", *map(int, out[1:])
    assert done
    assert after < before
    assert again == before
