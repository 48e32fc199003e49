"""What a model applies after its last layer to turn a hidden state into scores: the readout.

The output stage of ``attnlab explain`` and the logit lens both need it, and it differs by
family only in its parts:

    decoder-only (GPT-2, Llama)   logits = Norm_f(h) · W_Uᵀ                  (…, vocab)
    encoder–decoder's decoder     logits = Norm_f(h) [· d^-½, T5 tied] · W_Uᵀ (…, tgt_vocab)
    BERT (masked LM)              logits = LN(act(W_t·Norm_f(h) + b_t)) · Eᵀ + b
    ViT                           logits = Norm_f(h[CLS]) · W_cᵀ + b_c        (…, labels)

``Norm_f`` is the stack's final norm: pre-LN models have one (GPT-2's ``ln_f``, Llama's final
RMSNorm); post-LN models (the paper's, BERT) end each layer with a norm and have none more.
The layer outputs the hooks record are taken *before* ``Norm_f``, so the readout applies it:
its value on the last layer's output is exactly what the model's own head reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from attnlab.errors import BadInput


@dataclass
class Readout:
    """``h (…, d_model)`` -> scores ``(…, vocab or labels)``: the final norm, then the head."""

    norm: nn.Module | None  # the final norm, None where the stack has none (post-LN)
    head: Callable[[Tensor], Tensor]  # Norm_f(h) -> logits
    weight: Tensor  # W_U (or W_c): (vocab, d) — what the head multiplies by
    tied: bool  # W_U is the token embedding E itself
    parts: list[str]  # the readout's steps, in words, in order
    vocabulary: str  # what the scores are over: "vocabulary", "target vocabulary", "labels"

    def normed(self, h: Tensor) -> Tensor:
        """``Norm_f(h)``: what the head reads."""
        return h if self.norm is None else self.norm(h)

    def __call__(self, h: Tensor) -> Tensor:
        return self.head(self.normed(h))


def _norm(stack_norm: nn.Module) -> nn.Module | None:
    return None if isinstance(stack_norm, nn.Identity) else stack_norm


def _norm_words(norm: nn.Module | None) -> list[str]:
    return [] if norm is None else [f"final norm ({type(norm).__name__})"]


def readout(model: nn.Module) -> Readout:
    """The readout of ``model`` (module docstring); a model with no output layer (an encoder
    without a masked-LM head, a ViT without a classifier, a classifier head on BERT) is a
    :class:`~attnlab.errors.BadInput` naming what it lacks."""
    from attnlab.models import BERT, GPT, Transformer, ViT

    if isinstance(model, GPT):
        norm = _norm(model.blocks.norm)
        tied = model.lm_head.weight is model.embed.weight
        return Readout(norm, model.lm_head, model.lm_head.weight, tied,
                       _norm_words(norm) + [f"W_U {_shape(model.lm_head.weight)}"
                                            f"{' (tied: W_U = E)' if tied else ' (its own)'}"],
                       "vocabulary")
    if isinstance(model, Transformer):
        norm = _norm(model.decoder.norm)
        tied = model.lm_head.weight is model.tgt_embed.weight
        scale = model.config.d_model ** -0.5 if model.config.scale_tied_logits else None

        def head(h: Tensor) -> Tensor:
            return model.lm_head(h if scale is None else h * scale)

        words = _norm_words(norm) + ([f"· d_model^-½ = {scale:.4f} (T5's tied head)"]
                                     if scale is not None else [])
        words.append(f"W_U {_shape(model.lm_head.weight)}"
                     f"{' (tied: W_U = E)' if tied else ' (its own)'}")
        return Readout(norm, head, model.lm_head.weight, tied, words, "target vocabulary")
    if isinstance(model, BERT):
        if model.mlm is None:
            raise BadInput(f"the model's head is {model.config.head!r}: it has no masked-LM "
                           "output layer over the vocabulary")
        norm = _norm(model.encoder.norm)
        mlm = model.mlm
        return Readout(norm, mlm, mlm.weight, True,
                       _norm_words(norm) + [
                           f"transform: LayerNorm({model.config.activation}(W_t · h + b_t))",
                           f"· Eᵀ + b, E {_shape(mlm.weight)} (tied: the input embedding)"],
                       "vocabulary")
    if isinstance(model, ViT):
        if model.classifier is None:
            raise BadInput("the ViT has no classifier head (head='none'): no output layer")
        norm = _norm(model.encoder.norm)
        return Readout(norm, model.classifier, model.classifier.weight, False,
                       _norm_words(norm) + [f"W_c {_shape(model.classifier.weight)} + b_c "
                                            "(on [CLS])"], "labels")
    raise BadInput(f"no output layer known for a {type(model).__name__}")


def _shape(weight: Tensor) -> str:
    """A weight's shape as it is stored and multiplied, ``h · Wᵀ``: (out × in), e.g. W_U is
    (vocabulary × d_model), the shape of E it may be tied to."""
    return f"({weight.shape[0]} × {weight.shape[1]})"


__all__ = ["Readout", "readout"]
