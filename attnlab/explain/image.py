"""One image through a Vision Transformer: the patch embedding recomputed and checked, the
shared encoder-layer walkthrough, the prediction; and attention rollout, where [CLS] looks.

The image walkthrough (:func:`walk_image`), for an image ``(C, H, W)`` cut into
``N = (H/P)·(W/P)`` patches of ``P × P`` pixels (ViT, Dosovitskiy et al., 2021, Eq. 1):

    x_p          the patches, each flattened channel, row, column        (N, P²·C)
    x_p·E + b    the shared linear projection (= the model's Conv2d)     (N, D)
    [x_cls; …]   the learned [CLS] vector put first                      (1 + N, D)
    z₀           + E_pos, the learned positions                          (1 + N, D)
    layer ℓ      as for a sentence (:func:`~attnlab.explain.walkthrough.layer_stages`)
    y            LN(z_L)[0], the final-normed [CLS] state                (D,)
    logits, p    y·W_cᵀ + b_c, softmax                                   (num_labels,)

Each stage is computed here from the model's parameters with plain tensor operations (a
reshape, a matrix product, a concatenation, a sum, a layer norm written out) and checked
against the model's own forward pass, recorded by hooks (:meth:`ImageSubject.run_model`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.explain.subject import OwnRun, record_run
from attnlab.explain.walkthrough import Check, Stage, Walkthrough, begin, diff, layer_stages


# --- attention rollout -------------------------------------------------------------------------
def attention_rollout(weights: Tensor) -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020): how much of each input position reaches
    each position after all the layers, the residual connections counted.

    ``weights (layers, heads, seq, seq)``: each layer's attention, rows the queries (each row
    sums to 1), layer 1 first. With ``I`` the ``(seq, seq)`` identity::

        Ā_l = mean_h A_l                          (seq, seq)   the heads averaged
        Â_l = (Ā_l + I) / rowsum(Ā_l + I)         (seq, seq)   the residual path added; rows
                                                               renormalised to sum to 1
        R   = Â_L · … · Â_2 · Â_1                 (seq, seq)

    Returns ``R (seq, seq)`` (computed in float64, returned in ``weights``' dtype): row i says
    how much each input position contributes to position i's final state; every row sums to
    1. For a ViT, ``R[0, 1:]`` is the [CLS] row over the N patches.
    """
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise BadInput(f"attention_rollout: weights must be (layers, heads, seq, seq), got "
                       f"{tuple(weights.shape)}")
    mean = weights.detach().double().mean(dim=1)  # (layers, seq, seq)
    eye = torch.eye(weights.shape[-1], dtype=torch.float64, device=weights.device)
    rollout = eye
    for a in mean:
        a = a + eye
        rollout = (a / a.sum(dim=-1, keepdim=True)) @ rollout  # Â_l · (Â_{l-1} · … · Â_1)
    return rollout.to(weights.dtype)


@dataclass
class ImageAttention:
    """What ``plot attention --image`` draws: the [CLS] rollout on the patch grid and the
    model's prediction (None without a classifier head)."""

    weights: Tensor  # (layers, heads, 1 + N, 1 + N), the model's own
    rollout: Tensor  # R (1 + N, 1 + N)
    cls_map: Tensor  # R[0, 1:] as (grid, grid): patch i at row i // grid, column i % grid
    probabilities: Tensor | None  # softmax of the logits, (num_labels,)
    predicted: int | None


@torch.no_grad()
def image_attention(model: nn.Module, image: Tensor) -> ImageAttention:
    """Run ``model`` (a ViT) on ``image (1, C, H, W)`` with ``need_weights`` and roll its
    attention out (:func:`attention_rollout`)."""
    out = model(image, need_weights=True)
    weights = torch.stack([layer.attn_weights[0] for layer in model.encoder.layers])
    rollout = attention_rollout(weights)
    grid = model.patch_embed.grid
    cls_map = rollout[0, 1:].reshape(grid, grid)
    if getattr(model, "classifier", None) is None:
        return ImageAttention(weights, rollout, cls_map, None, None)
    probs = out[0].float().softmax(-1)
    return ImageAttention(weights, rollout, cls_map, probs, int(probs.argmax()))


# --- the walkthrough ---------------------------------------------------------------------------
@dataclass
class ImageRun(OwnRun):
    """The model's own run of an image: :class:`OwnRun`'s per-layer tensors, and the patch
    embedding's and the head's outputs (batch index dropped)."""

    patch_embeddings: Tensor | None = None  # the patch convolution's output, (N, D)
    z0: Tensor | None = None  # model.embeddings(image), (1 + N, D)
    logits: Tensor | None = None  # (num_labels,), None without a classifier head


@dataclass
class ImageSubject:
    """An image and a ViT: what :func:`walk_image` follows (the
    :class:`~attnlab.explain.subject.EncoderInput` interface)."""

    label: str  # the model, in words
    model: nn.Module
    name: str  # the image, in words
    image: Tensor  # (1, C, H, W), in [0, 1]
    tokens: list[str]  # "[CLS]", "p0", …, "p{N-1}"
    layers: nn.ModuleList
    positional: nn.Module  # none: the positions are added in z₀
    positions: Tensor  # (1 + N,)
    mask: Tensor  # (1 + N, 1 + N), all True

    @property
    def title(self) -> str:
        return self.name

    @property
    def input_line(self) -> str:
        pe = self.model.patch_embed
        c, h, w = self.image.shape[1:]
        return (f"image: {self.name}, (C, H, W) = ({c}, {h}, {w}): {pe.n_patches} patches of "
                f"{pe.patch_size}×{pe.patch_size}×{c} ({pe.grid}×{pe.grid}, numbered row by "
                "row), [CLS] first")

    def run_model(self) -> ImageRun:
        """The model's own forward pass with need_weights, recorded by forward hooks: each
        layer (:func:`~attnlab.explain.subject.record_run`), the patch convolution, z₀ and the
        logits."""
        run = ImageRun()

        def conv(module, args, out) -> None:
            run.patch_embeddings = out[0].flatten(1).T.detach()  # (D, g, g) -> (N, D)

        def embeddings(module, args, out) -> None:
            run.z0 = out[0].detach()

        def forward() -> None:
            out = self.model(self.image, need_weights=True)
            run.logits = out[0].detach() if self.model.classifier is not None else None

        pe = self.model.patch_embed
        hooks = [pe.projection.register_forward_hook(conv),
                 pe.register_forward_hook(embeddings)]
        try:
            return record_run(self.layers, forward, run)
        finally:
            for h in hooks:
                h.remove()


def make_image_subject(model: nn.Module, image: Tensor, name: str, label: str) -> ImageSubject:
    """``image (1, C, H, W)`` (checked against the model's shape) and ``model``, a ViT."""
    from attnlab.nn import NoPositionalEncoding

    model.patch_embed.check(image)
    seq = 1 + model.n_patches
    return ImageSubject(label, model, name, image, ["[CLS]"] + [f"p{i}" for i in range(seq - 1)],
                        model.encoder.layers, NoPositionalEncoding(), torch.arange(seq),
                        torch.ones(seq, seq, dtype=torch.bool))


def cut_patches(image: Tensor, patch: int) -> Tensor:
    """``image (C, H, W)`` -> ``x_p (N, C·P·P)``: patch i covers rows ``(i // g)·P …`` and
    columns ``(i % g)·P …`` (g = W / P patches a row), its pixels flattened channel, row,
    column: the order of the Conv2d weight ``(D, C, P, P)``."""
    c, h, w = image.shape
    gh, gw = h // patch, w // patch
    blocks = image.reshape(c, gh, patch, gw, patch)  # (c, patch row, y, patch column, x)
    return blocks.permute(1, 3, 0, 2, 4).reshape(gh * gw, c * patch * patch)


def _layer_norm(x: Tensor, norm: nn.Module) -> Tensor:
    """LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β over the last axis, written out (RMSNorm: no μ, no
    β); the identity for a model without a final norm."""
    if isinstance(norm, nn.Identity):
        return x
    if isinstance(norm, nn.LayerNorm):
        mu = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        bias = 0 if norm.bias is None else norm.bias
        return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight + bias
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


def walk_image(subject: ImageSubject, layer: int = 0, head: int = 0,
               tol: float = 1e-5) -> Walkthrough:
    """Every stage of the module docstring for ``subject``, layer ``layer``, head ``head``,
    with the checks made on the way."""
    w = begin(subject, layer, head)
    own: ImageRun = w.own
    add, check = w.stages.append, w.checks.append
    model, pe = subject.model, subject.model.patch_embed
    p, image = pe.patch_size, subject.image[0].to(pe.projection.weight.dtype)
    c = image.shape[0]
    with torch.no_grad():
        add(Stage("image", f"pixels in [0, 1], channel 0 of {c}" if c > 1
                  else "pixels in [0, 1]", image[0], f"(C, H, W) = {tuple(image.shape)}"))
        patches = cut_patches(image, p)
        add(Stage("patches", f"x_p: {pe.n_patches} patches of {p}×{p}×{c}, each flattened "
                  "(channel, row, column)", patches,
                  f"patch i is row i // {pe.grid}, column i % {pe.grid} of the patch grid"))
        unfolded = F.unfold(image[None], kernel_size=p, stride=p)[0].T  # (N, C·P·P)
        check(Check("the patches cut by hand equal torch's unfold (im2col, Conv2d's order)",
                    diff(patches, unfolded), tol))
        e = pe.projection.weight.reshape(pe.projection.out_channels, -1).T  # (P²·C, D)
        bias = 0 if pe.projection.bias is None else pe.projection.bias
        embedded = patches @ e + bias
        add(Stage("patch embeddings", "x_p · E + b  (E: the patch Conv2d's kernel, flattened)",
                  embedded, f"E {tuple(e.shape)} (P²·C × D)"))
        check(Check("x_p·E + b equals the model's own patch convolution",
                    diff(embedded, own.patch_embeddings), tol))
        with_cls = torch.cat([pe.cls[0], embedded])
        add(Stage("[CLS] prepended", "[x_cls; x_p·E + b]", with_cls,
                  "row 0 is the learned [CLS] vector"))
        positions = pe.positions[0]
        add(Stage("positions", "E_pos, learned: one row per position, [CLS] first", positions))
        z0 = with_cls + positions
        add(Stage("z₀", "z₀ = [x_cls; x_p·E + b] + E_pos", z0))
        check(Check("z₀ by hand equals the model's own embeddings (model.embeddings)",
                    diff(z0, own.z0), tol))
        check(Check("z₀ by hand equals the input the model's first layer received",
                    diff(z0, own.layer_inputs[0]), tol))
    layer_stages(w, tol)
    with torch.no_grad():
        rollout = attention_rollout(torch.stack(own.weights))  # every layer, the model's own
        add(Stage("attention rollout", "[CLS] row of Â_L·…·Â_1, Â_l = (mean_h A_l + I) / "
                  "rowsum, on the patch grid", rollout[0, 1:].reshape(pe.grid, pe.grid),
                  "all layers; plot attention --image draws it over the image"))
        y = _layer_norm(own.layer_outputs[-1][0], model.encoder.norm)
        add(Stage("[CLS] final state", f"y = LN(z_{len(subject.layers)})[0], the last layer's "
                  "[CLS] output, normed", y))
        if model.classifier is None:
            add(Stage("prediction", "none: the model has no classifier head", None))
            return w
        logits = y @ model.classifier.weight.T + model.classifier.bias
        add(Stage("logits", "y · W_cᵀ + b_c", logits,
                  f"W_c {tuple(model.classifier.weight.T.shape)}"))
        check(Check("the logits by hand equal the model's own output",
                    diff(logits, own.logits), tol))
        exp = torch.exp(logits - logits.max())
        probs = exp / exp.sum()
        k = int(probs.argmax())
        add(Stage("prediction", "softmax(logits) = exp(logits) / Σ exp(logits)", probs,
                  f"predicted class {k}, p = {float(probs[k]):.4f}"))
    return w


def load_image_model(spec: str | None, seed: int = 0,
                     command: str = "--image") -> tuple[nn.Module, str, str]:
    """``(model, label, source)`` for ``--model`` with ``--image``: None (a freshly
    initialised ``vit-tiny``, random weights, seeded with ``seed``) or a ViT folder (a run,
    a model folder, a Hugging Face ViT); any other model is a one-line error naming
    ``command``."""
    if spec is None:
        from attnlab.build import build_model
        from attnlab.config import ModelConfig

        torch.manual_seed(seed)
        model = build_model(ModelConfig.from_preset("vit-tiny", dropout=0.0)).eval()
        return (model, f"vit-tiny (freshly initialised, seed {seed}: random weights)",
                f"a random vit-tiny (untrained, seed {seed})")
    from attnlab.storage import load

    loaded = load(spec).expect("vision", command)
    return loaded.model, str(spec), str(loaded.path)
