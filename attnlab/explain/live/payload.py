"""The JSON the live page reads, shaped from the explain package's results: a layer of a view,
a stage, a check, the neuron view's inputs, a ViT's rollout, an ablation and a patching."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.errors import BadInput
from attnlab.explain.page_data import num, nums


def image_tensor(value: list, channels: int, size: int) -> Tensor:
    """A drawn image: ``size × size`` (grey) or ``channels × size × size`` numbers in [0, 1]."""
    want = f"{size}×{size}" + (f" or {channels}×{size}×{size}" if channels > 1 else "")
    try:
        image = torch.tensor(value, dtype=torch.float32)
    except (TypeError, ValueError):
        raise BadInput(f"the image must be {want} numbers in [0, 1]") from None
    shape = tuple(image.shape)
    if shape == (size, size):
        image = image.expand(channels, -1, -1)
    if tuple(image.shape) != (channels, size, size):
        raise BadInput(f"the image is {'×'.join(map(str, shape)) or 'a number'}: the model "
                       f"reads {want} pixels")
    if not bool(((image >= 0) & (image <= 1)).all()):
        raise BadInput("the image's pixels must be numbers in [0, 1]")
    return image[None].contiguous()


def chosen_layer(view: dict, layer: int, prefix: str) -> dict:
    weights = view["weights"]
    layer = min(layer, len(weights) - 1)  # an encoder–decoder's stacks may differ in depth
    return {**{k: v for k, v in view.items() if k != "weights"}, "layers": len(weights),
            "heads": len(weights[layer]), "ablate_prefix": prefix, "layer": layer,
            "weights": nums(weights[layer])}


def stage(i: int, s) -> dict:
    return {"i": i, "title": s.title, "formula": s.formula, "note": s.note,
            "shape": list(s.shape) if s.shape is not None else None}


def check(c) -> dict:
    return {"name": c.name, "error": num(c.error), "tol": c.tol, "ok": c.ok}


def neuron(w, view: str) -> dict | None:
    """The chosen head's Q and K (after RoPE, where the model rotates), its scale, any score
    bias (ALiBi, T5), the mask and its weights: what the page's neuron view recomputes."""
    titles = {s.title: s for s in w.stages}
    if not {"Q", "K", "mask", "attention weights"} <= set(titles):
        return None
    attn = w.subject.layers[w.layer].self_attn
    scale = 1 / math.sqrt(attn.d_k) if attn.scale is None else attn.scale
    seq = len(w.subject.tokens)
    bias = w.subject.positional.attention_bias(w.subject.positions, seq)
    if bias is not None:
        bias = bias[0, w.head if bias.shape[1] > 1 else 0]
    return {"view": view,
            "q": nums(titles["Q"].value), "k": nums(titles["K"].value), "scale": scale,
            "bias": nums(bias) if bias is not None else None,
            "mask": titles["mask"].value.tolist(),
            "weights": nums(titles["attention weights"].value)}


def image_view(w) -> dict:
    from attnlab.explain.image import image_attention

    subject = w.subject
    seen = image_attention(subject.model, subject.image)
    size = subject.image.shape[-1]
    return {"size": size, "pixels": nums(subject.image[0].mean(0)),
            "grid": subject.model.patch_embed.grid, "rollout": nums(seen.cls_map),
            "label": subject.name}


def ablation(probe, heads) -> dict:
    """What ``explain --ablate`` prints, as data (:func:`format_ablation`'s numbers)."""
    from attnlab.explain.interventions import ablate, ablation_table

    done = ablate(probe, heads)
    table = ablation_table(probe, done)
    return {"heads": [h.text for h in heads], **table,
            "check": check(done.check) if done.check is not None else None,
            "note": done.note}


def patching(probe, other) -> dict:
    from attnlab.explain.interventions import patch_from

    found = patch_from(probe, other)
    return {"rows": found.rows, "cols": [f"h{h}" for h in range(found.effect.shape[1])],
            "effect": nums(found.effect), "a": probe.token_text(found.main_token),
            "b": probe.token_text(found.other_token), "d_main": num(found.main_diff),
            "d_other": num(found.other_diff), "same_top": found.same_top}


__all__ = ["ablation", "chosen_layer", "check", "image_tensor", "image_view", "neuron", "patching",
           "stage"]
