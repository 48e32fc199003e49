"""Pictures (matplotlib, written as PNG): attention heatmaps and grids, cross-attention
alignments, a ViT's [CLS] attention rollout over its image, the sinusoidal positional-encoding
matrix, learning-rate schedules, loss curves, a classifier's confusion matrix.

Each picture has a ``figure_*`` function that builds it and returns the matplotlib ``Figure``
(drawn on its own Agg canvas; pyplot and its global backend are not touched), and a ``plot_*``
function that writes that figure to a PNG file. Every figure is laid out by matplotlib's
constrained layout, which keeps the figure title clear of the panel titles and makes room for
tick and axis labels, and is then grown until all of its text lies inside it (a title wider than
its heatmap, labels of many long tokens): see :func:`_fit`.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # matplotlib is imported only when a picture is drawn
    from matplotlib.figure import Figure

FONT_INCHES = 10 / 72 * 0.6  # the width of a character of 10-point text, about


# --- attention ---------------------------------------------------------------------------------
def figure_cross_attention(weights: torch.Tensor, src_tokens: list[str], tgt_tokens: list[str],
                           title: str = "cross-attention") -> Figure:
    """``weights (tgt_len, src_len)``: which source token each output token attended to.
    Returns the figure: a heatmap, a row per output token, a column per source token."""
    w = weights.detach().float().cpu().numpy()
    longest_src = max(map(len, src_tokens), default=0)
    longest_tgt = max(map(len, tgt_tokens), default=0)
    fontsize = 10 if len(src_tokens) <= 12 else 8  # many source tokens: smaller labels
    label_room = math.sin(math.radians(60)) * longest_src * FONT_INCHES * fontsize / 10
    fig = _figure(1.2 + 0.45 * len(src_tokens) + longest_tgt * FONT_INCHES,
                  1.4 + 0.3 * len(tgt_tokens) + label_room, dpi=120)
    ax = fig.add_subplot()
    ax.imshow(w, cmap="viridis", aspect="auto", vmin=0.0, vmax=max(float(w.max()), 1e-6))
    ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=60, ha="right",
                  rotation_mode="anchor", fontsize=fontsize)
    ax.set_yticks(range(len(tgt_tokens)), tgt_tokens)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    ax.set_title(title)
    return _fit(fig)


def plot_cross_attention(weights: torch.Tensor, src_tokens: list[str], tgt_tokens: list[str],
                         path: str | Path, title: str = "cross-attention") -> Path:
    """:func:`figure_cross_attention` written as a PNG; returns ``path``."""
    return _save(figure_cross_attention(weights, src_tokens, tgt_tokens, title), path)


def figure_attention_grid(weights: torch.Tensor, tokens: list[str],
                          title: str = "self-attention", first_layer: int = 0) -> Figure:
    """``weights (layers, heads, seq, seq)`` as a grid of heatmaps: a row per layer (numbered
    from ``first_layer``), a column per head; rows of each map are queries, columns keys, and
    one colour bar gives the scale (0 to 1). Returns the figure, ``title`` above the grid;
    tokens label the first column and the last row (the other maps have no ticks)."""
    w = weights.detach().float().cpu().numpy()
    n_layers, n_heads = w.shape[:2]
    size = 0.35 * len(tokens) + 0.8
    label_room = max(map(len, tokens), default=0) * FONT_INCHES * 0.6  # 6-point labels
    fig = _figure(size * n_heads + label_room, size * n_layers + label_room + 0.4, dpi=100)
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    ticks = range(len(tokens))
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            shown = ax.imshow(w[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {first_layer + layer} head {head}", fontsize=7)
            if layer == n_layers - 1:  # ticks only where labelled: a 6 x 12 grid draws fast
                ax.set_xticks(ticks, tokens, rotation=90, fontsize=6)
            else:
                ax.set_xticks([])
            if head == 0:
                ax.set_yticks(ticks, tokens, fontsize=6)
            else:
                ax.set_yticks([])
    fig.colorbar(shown, ax=axes, shrink=min(1.0, 0.9 / n_layers + 0.3), label="weight")
    fig.suptitle(title)
    return _fit(fig)


def figure_attention_head(weights: torch.Tensor, tokens: list[str],
                          title: str = "self-attention") -> Figure:
    """One head's ``weights (seq, seq)`` as a heatmap with readable labels: a row per query
    (the attending token), a column per key (the attended one), each row summing to 1; the
    weights are written in the cells up to 12 tokens, and a colour bar gives the scale."""
    w = weights.detach().float().cpu().numpy()
    n = len(tokens)
    fontsize = 10 if n <= 16 else 8
    longest = max(map(len, tokens), default=0) * FONT_INCHES * fontsize / 10
    side = 1.0 + 0.45 * n
    fig = _figure(side + longest + 1.2, side + longest + 0.8, dpi=120)
    ax = fig.add_subplot()
    shown = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(n), tokens, rotation=60, ha="right", rotation_mode="anchor",
                  fontsize=fontsize)
    ax.set_yticks(range(n), tokens, fontsize=fontsize)
    ax.set_xlabel("key (the token attended to)")
    ax.set_ylabel("query (the token attending)")
    if n <= 12:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if w[i, j] < 0.6 else "black")
    fig.colorbar(shown, ax=ax, label="weight (each row sums to 1)")
    ax.set_title(title)
    return _fit(fig)


def plot_attention_head(weights: torch.Tensor, tokens: list[str], path: str | Path,
                        title: str = "self-attention") -> Path:
    """:func:`figure_attention_head` written as a PNG; returns ``path``."""
    return _save(figure_attention_head(weights, tokens, title), path)


def plot_attention_grid(weights: torch.Tensor, tokens: list[str], path: str | Path,
                        title: str = "self-attention", first_layer: int = 0) -> Path:
    """:func:`figure_attention_grid` written as a PNG; returns ``path``."""
    return _save(figure_attention_grid(weights, tokens, title, first_layer), path)


def figure_image_attention(image: torch.Tensor, attention: torch.Tensor,
                           title: str = "attention rollout") -> Figure:
    """Where a ViT's [CLS] looks: ``image (C, H, W)`` or ``(H, W)`` in [0, 1] (shown in gray,
    the mean of its channels) and ``attention (grid, grid)`` (the [CLS] row of the attention
    rollout over the patches, patch i at row i // grid, column i % grid) upsampled to the
    image, each patch's value over its ``H/grid × W/grid`` pixels, and laid over it (alpha
    0.55) with a colour bar. Returns the figure: the image alone, then with the overlay,
    ``title`` above both."""
    import numpy as np

    pixels = image.detach().float().cpu()
    pixels = (pixels.mean(0) if pixels.dim() == 3 else pixels).numpy()  # (H, W)
    a = attention.detach().float().cpu().numpy()  # (grid, grid)
    h, w = pixels.shape
    upsampled = np.kron(a, np.ones((h // a.shape[0], w // a.shape[1])))  # (H, W)
    fig = _figure(7, 3.6, dpi=120)
    left, right = fig.subplots(1, 2)
    for ax in (left, right):
        ax.imshow(pixels, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
    left.set_title("image")
    overlay = right.imshow(upsampled, cmap="inferno", alpha=0.55, interpolation="nearest",
                           vmin=float(a.min()), vmax=max(float(a.max()), float(a.min()) + 1e-9))
    right.set_title("[CLS] attention rollout")
    fig.colorbar(overlay, ax=right, label="share of [CLS]")
    fig.suptitle(title)
    return _fit(fig)


def plot_image_attention(image: torch.Tensor, attention: torch.Tensor, path: str | Path,
                         title: str = "attention rollout") -> Path:
    """:func:`figure_image_attention` written as a PNG; returns ``path``."""
    return _save(figure_image_attention(image, attention, title), path)


def figure_lens(probs: torch.Tensor, cells: list[list[str]], layers: list[str],
                tokens: list[str], title: str = "logit lens") -> Figure:
    """The logit lens: ``probs (layers, positions)`` as colour (the probability each layer
    gives the final prediction), each cell labelled by that layer's top token ``cells``; a row
    per layer (the last at the top), a column per read position."""
    p = probs.detach().float().cpu().numpy()[::-1]
    rows = layers[::-1]
    width = max([len(c) for row in cells for c in row] + [4])
    fig = _figure(1.2 + (0.25 + width * FONT_INCHES * 0.8) * len(tokens), 1.2 + 0.28 * len(rows),
                  dpi=110)
    ax = fig.add_subplot()
    image = ax.imshow(p, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
    for i, row in enumerate(cells[::-1]):
        for j, text in enumerate(row):
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if p[i, j] > 0.6 else "white")
    ax.set_xticks(range(len(tokens)), tokens, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("position (the token read)")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="p(final prediction)")
    return _fit(fig)


def plot_lens(probs: torch.Tensor, cells: list[list[str]], layers: list[str], tokens: list[str],
              path: str | Path, title: str = "logit lens") -> Path:
    """:func:`figure_lens` written as a PNG; returns ``path``."""
    return _save(figure_lens(probs, cells, layers, tokens, title), path)


# --- positions, schedules, training ------------------------------------------------------------
def figure_positional_encoding(max_len: int, d_model: int) -> Figure:
    """Returns the figure of the sinusoidal matrix PE (positions × dimensions) of section 3.5,
    with a colour bar."""
    from attnlab.nn import sinusoidal_table

    fig = _figure(7, 4, dpi=120)
    ax = fig.add_subplot()
    image = ax.imshow(sinusoidal_table(max_len, d_model).numpy(), cmap="RdBu", aspect="auto",
                      vmin=-1, vmax=1)
    ax.set_xlabel("dimension i (even: sin, odd: cos)")
    ax.set_ylabel("position")
    ax.set_title(f"sinusoidal positional encoding, d_model = {d_model}")
    fig.colorbar(image, ax=ax)
    return _fit(fig)


def plot_positional_encoding(max_len: int, d_model: int, path: str | Path) -> Path:
    """:func:`figure_positional_encoding` written as a PNG; returns ``path``."""
    return _save(figure_positional_encoding(max_len, d_model), path)


def figure_schedule(schedule, steps: int, title: str | None = None) -> Figure:
    """Returns the figure of the learning rate against step for any schedule (a function of
    the 1-based step), titled ``title`` or the schedule's class name."""
    xs = list(range(1, steps + 1))
    fig = _figure(6, 3.5, dpi=120)
    ax = fig.add_subplot()
    ax.plot(xs, [schedule(s) for s in xs])
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title or type(schedule).__name__)
    ax.grid(alpha=0.3)
    return _fit(fig)


def plot_schedule(schedule, steps: int, path: str | Path, title: str | None = None) -> Path:
    """:func:`figure_schedule` written as a PNG; returns ``path``."""
    return _save(figure_schedule(schedule, steps, title), path)


def figure_loss_curve(metrics_path: str | Path) -> Figure:
    """Returns the figure of the training loss (and NLL) against step, from metrics.jsonl."""
    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines()]
    fig = _figure(6, 3.5, dpi=120)
    ax = fig.add_subplot()
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="label-smoothed loss")
    ax.plot([r["step"] for r in rows], [r["nll"] for r in rows], label="NLL", alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss per target token")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    return _fit(fig)


def plot_loss_curve(metrics_path: str | Path, png_path: str | Path) -> Path:
    """:func:`figure_loss_curve` written as a PNG; returns ``png_path``."""
    return _save(figure_loss_curve(metrics_path), png_path)


# --- scores --------------------------------------------------------------------------------------
def figure_confusion_matrix(confusion: list[list[int]] | tuple[tuple[int, ...], ...],
                            labels: list[str] | tuple[str, ...],
                            title: str = "confusion matrix") -> Figure:
    """``confusion[true][predicted]`` counts as a heatmap, a row per true label and a column
    per predicted label, each cell with its count. Colour is the share of its row (the
    recall of that row's class), so a rare class's errors show as plainly as a common one's."""
    counts = torch.tensor(confusion, dtype=torch.float64)
    shares = (counts / counts.sum(1, keepdim=True).clamp(min=1)).numpy()
    n, longest = len(labels), max(map(len, labels), default=0)
    fig = _figure(2.0 + 0.6 * n + longest * FONT_INCHES, 1.6 + 0.5 * n + longest * FONT_INCHES,
                  dpi=120)
    ax = fig.add_subplot()
    ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    for t in range(n):
        for p in range(n):  # dark cells get white text
            ax.text(p, t, f"{int(counts[t, p]):,}", ha="center", va="center", fontsize=9,
                    color="white" if shares[t, p] > 0.5 else "black")
    ax.set_xticks(range(n), labels, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    ax.set_title(title)
    return _fit(fig)


def plot_confusion_matrix(confusion: list[list[int]] | tuple[tuple[int, ...], ...],
                          labels: list[str] | tuple[str, ...], path: str | Path,
                          title: str = "confusion matrix") -> Path:
    """:func:`figure_confusion_matrix` written as a PNG; returns ``path``."""
    return _save(figure_confusion_matrix(confusion, labels, title), path)


# --- shared --------------------------------------------------------------------------------------
def _figure(width: float, height: float, dpi: int) -> Figure:
    """An empty figure (inches) with constrained layout, on an Agg canvas of its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _fit(fig: Figure, tries: int = 8) -> Figure:
    """Returns ``fig``, grown until the bounding box of everything it draws (titles, tick and
    axis labels, colour bars) lies inside it. Constrained layout makes room for what sits
    beside the axes, but not for a title wider than the figure (a short heatmap under a long
    title) nor for labels in a figure too small for them, so the figure is made wider or taller
    by twice the larger overflow on each axis (titles are centred) and laid out again."""
    for _ in range(tries):
        with warnings.catch_warnings():  # "axes sizes collapsed": the figure is grown below
            warnings.filterwarnings("ignore", "constrained_layout not applied")
            fig.draw_without_rendering()
            box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
        width, height = fig.get_size_inches()
        over_x = max(-box.x0, box.x1 - width, 0.0)
        over_y = max(-box.y0, box.y1 - height, 0.0)
        if max(over_x, over_y) * fig.dpi < 0.5:
            return fig
        fig.set_size_inches(width + 2 * over_x + (0.1 if over_x else 0.0),
                            height + 2 * over_y + (0.1 if over_y else 0.0))
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as the image file ``path`` (PNG by its suffix); returns ``path``."""
    fig.savefig(path)
    return Path(path)
