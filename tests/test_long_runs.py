"""Long runs stay flat: memory does not grow with the number of generations or training steps.

Each run is a child process, so that only its own memory counts. The resident set size (RSS,
from /proc) is read after a warm-up (caches, allocator pools and lazily built kernels are then
in place) and at the end; it must grow by less than 5%."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

if not Path("/proc/self/status").exists():
    pytest.skip("RSS is read from /proc (Linux)", allow_module_level=True)

RSS = ("def rss():\n"
       "    for line in open('/proc/self/status'):\n"
       "        if line.startswith('VmRSS:'):\n"
       "            return int(line.split()[1]) * 1024\n")

GENERATE = RSS + """
import torch
from attnlab import GPT, ModelConfig
from attnlab.generation import generate
torch.manual_seed(0)
model = GPT(ModelConfig.from_preset("gpt-mini", vocab_size=64, d_model=64, n_heads=4,
                                    n_decoder_layers=2, max_len=64, dropout=0.0)).eval()
prompt = torch.tensor([[5, 6, 7, 8]])
for i in range(500):
    if i == 50:
        warm = rss()
    generate(model, prompt, 16, temperature=0.8, top_k=20,
             generator=torch.Generator().manual_seed(i))
print(warm, rss())
"""


def _growth(before: int, after: int) -> float:
    return (after - before) / before


def test_500_generations_in_one_process_stay_flat():
    r = subprocess.run([sys.executable, "-c", GENERATE], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    warm, end = map(int, r.stdout.split())
    assert _growth(warm, end) < 0.05, (warm, end)


def _rss_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_2000_training_steps_stay_flat(tmp_path):
    """``attnlab train lm``: the RSS at step 200 and at step 1,900, read by the parent while
    the trainer runs (its metrics.jsonl says which step it is at)."""
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i}: a small text to train on.\n" for i in range(400)))
    metrics = tmp_path / "run" / "metrics.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-m", "attnlab.cli", "train", "lm", "--text", str(text), "--preset",
         "gpt-mini", "--set", "d_model=32", "--set", "n_heads=2", "--set", "n_decoder_layers=1",
         "--block", "16", "--batch", "4", "--steps", "2000", "--save-every", "500",
         "--eval-every", "500", "--out", str(tmp_path / "run"), "--no-progress", "--device",
         "cpu", "--precision", "fp32"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    samples = {}
    deadline = time.monotonic() + 300
    try:
        while len(samples) < 2 and child.poll() is None and time.monotonic() < deadline:
            steps = metrics.read_bytes().count(b"\n") if metrics.exists() else 0
            for at in (200, 1900):
                if steps >= at and at not in samples:
                    samples[at] = _rss_of(child.pid)
            time.sleep(0.01)
    finally:
        child.wait(timeout=300)
    assert child.returncode == 0, child.stderr.read()
    assert set(samples) == {200, 1900}, samples
    assert _growth(samples[200], samples[1900]) < 0.05, samples
