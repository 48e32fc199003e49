"""A shortened demo runs end to end and writes what it promises."""

import subprocess
import sys


def test_short_demo_writes_checkpoint_curve_and_heatmap(tmp_path):
    r = subprocess.run([sys.executable, "-m", "attnlab.cli", "demo", "--out", str(tmp_path),
                        "--time-budget", "6", "--n-train", "5000", "--n-test", "20"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "held-out exact match" in r.stdout and "forty-two" in r.stdout
    for name in ("loss_curve.png", "cross_attention.png", "metrics.jsonl"):
        path = tmp_path / name
        assert path.exists() and path.stat().st_size > 1000, name
    assert list((tmp_path / "checkpoints").glob("step-*/model.safetensors"))
