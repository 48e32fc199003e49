"""Pictures (matplotlib, written as PNG): attention heatmaps and grids, cross-attention
alignments, the sinusoidal positional-encoding matrix, learning-rate schedules, loss curves."""

from __future__ import annotations

from pathlib import Path

import torch


def plot_cross_attention(weights: torch.Tensor, src_tokens: list[str], tgt_tokens: list[str],
                         path: str | Path, title: str = "cross-attention") -> Path:
    """``weights (tgt_len, src_len)``: which source token each output token attended to."""
    plt = _pyplot()
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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_attention_grid(weights: torch.Tensor, tokens: list[str], path: str | Path,
                        title: str = "self-attention") -> Path:
    """``weights (layers, heads, seq, seq)`` as a grid of heatmaps: a row per layer, a column
    per head; rows of each map are queries, columns keys."""
    plt = _pyplot()
    w = weights.detach().float().cpu().numpy()
    n_layers, n_heads = w.shape[:2]
    size = 0.35 * len(tokens) + 0.8
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(size * n_heads, size * n_layers),
                             dpi=100, squeeze=False)
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            ax.imshow(w[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer} head {head}", fontsize=7)
            ticks = range(len(tokens))
            ax.set_xticks(ticks, tokens if layer == n_layers - 1 else [], rotation=90,
                          fontsize=6)
            ax.set_yticks(ticks, tokens if head == 0 else [], fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_positional_encoding(max_len: int, d_model: int, path: str | Path) -> Path:
    """The sinusoidal matrix PE (positions × dimensions) of section 3.5."""
    from attnlab.nn import sinusoidal_table

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    image = ax.imshow(sinusoidal_table(max_len, d_model).numpy(), cmap="RdBu", aspect="auto",
                      vmin=-1, vmax=1)
    ax.set_xlabel("dimension i (even: sin, odd: cos)")
    ax.set_ylabel("position")
    ax.set_title(f"sinusoidal positional encoding, d_model = {d_model}")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_schedule(schedule, steps: int, path: str | Path, title: str | None = None) -> Path:
    """Learning rate against step for any schedule (a function of the 1-based step)."""
    plt = _pyplot()
    xs = list(range(1, steps + 1))
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(xs, [schedule(s) for s in xs])
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title or type(schedule).__name__)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_loss_curve(metrics_path: str | Path, png_path: str | Path) -> Path:
    """Training loss (and NLL) against step, from metrics.jsonl, as a PNG."""
    import json

    plt = _pyplot()
    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines()]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="label-smoothed loss")
    ax.plot([r["step"] for r in rows], [r["nll"] for r in rows], label="NLL", alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss per target token")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)
