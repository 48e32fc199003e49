"""Pictures: attention heatmaps (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path

import torch


def plot_cross_attention(weights: torch.Tensor, src_tokens: list[str], tgt_tokens: list[str],
                         path: str | Path, title: str = "cross-attention") -> Path:
    """``weights (tgt_len, src_len)``: which source token each output token attended to."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = weights.detach().float().cpu().numpy()
    fig, ax = plt.subplots(figsize=(1.0 + 0.45 * len(src_tokens), 1.0 + 0.3 * len(tgt_tokens)),
                           dpi=120)
    ax.imshow(w, cmap="viridis", aspect="auto", vmin=0.0, vmax=max(float(w.max()), 1e-6))
    ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=60, ha="right")
    ax.set_yticks(range(len(tgt_tokens)), tgt_tokens)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
