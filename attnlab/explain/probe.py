"""What the logit lens and the interventions run: one input, the model's own pass over it, and
the positions its output layer reads.

    decoder-only (GPT, Llama)   stack "blocks",  every position (each predicts the next token)
    BERT with an MLM head       stack "encoder", the [MASK] positions
    ViT with a classifier       stack "encoder", [CLS] (position 0)
    encoder–decoder             stack "decoder", every target position; the source is encoded

``Probe.forward()`` is the model's own forward pass (``Probe.forward(copy)``, a changed
copy's) and returns its scores at the read
positions, ``(len(read), vocab)``: what the last layer's lens must equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput
from attnlab.explain.output import piece  # one reading of a token id, shared with the output stage


@dataclass
class Probe:
    model: nn.Module
    stack: str  # the stack whose layers the lens reads: "blocks", "encoder" or "decoder"
    tokens: list[str]  # the stack's positions, labelled, (seq,)
    read: list[int]  # the positions the model's output layer reads
    call: Callable[[nn.Module], Tensor]  # a model's own pass -> scores at ``read``, (len(read), V)
    token_text: Callable[[int], str]  # an output id (token or label) as text
    source: list[str] | None = None  # the encoder–decoder's source tokens

    def forward(self, model: nn.Module | None = None) -> Tensor:
        """The model's own pass over the input (or ``model``'s: a changed copy), under no_grad:
        its scores at the read positions, ``(len(read), vocab)``."""
        with torch.no_grad():
            return self.call(self.model if model is None else model)

    @property
    def last(self) -> int:
        """The last read position: where the next token (or the last [MASK]) is predicted."""
        return self.read[-1]


def sentence_probe(model: nn.Module, tokenizer, sentence: str, target: str | None = None,
                   tgt_tokenizer=None) -> Probe:
    """``sentence`` through ``model`` (module docstring); ``target`` is an encoder–decoder's
    target prefix (default: the start token alone), in ``tgt_tokenizer`` (default:
    ``tokenizer``). No model runs here: bad input is refused first."""
    from attnlab.explain.readout import readout
    from attnlab.explain.subject import make_subject
    from attnlab.models import BERT, GPT, Transformer

    readout(model)  # a model with no output layer is refused before anything runs
    if isinstance(model, Transformer):
        return _seq2seq_probe(model, tokenizer, sentence, target, tgt_tokenizer or tokenizer)
    if target is not None:
        raise BadInput(f"a target prefix is for an encoder–decoder, not a {type(model).__name__}")
    subject = make_subject(model, tokenizer, sentence, "")
    ids = subject.ids
    text = lambda i: piece(tokenizer, int(i))  # noqa: E731
    if isinstance(model, GPT):
        return Probe(model, "blocks", subject.tokens, list(range(ids.shape[1])),
                     lambda m: m(ids)[0], text)
    if isinstance(model, BERT):
        read = (ids[0] == tokenizer.mask_id).nonzero().flatten().tolist()
        if not read:
            raise BadInput("BERT predicts tokens at [MASK] positions: put [MASK] in the "
                           f"sentence, e.g. {_masked_example(sentence)!r}")
        types = torch.zeros_like(ids)

        def forward(m: nn.Module) -> Tensor:
            out = m(ids, types, torch.ones_like(ids))
            return (out[0] if isinstance(out, tuple) else out)[0, read]  # pretraining: (mlm, nsp)

        return Probe(model, "encoder", subject.tokens, read, forward, text)
    raise BadInput(f"no logit lens for a {type(model).__name__}")


def _masked_example(sentence: str) -> str:
    words = sentence.split()
    return " ".join(words[:-1] + ["[MASK]"]) if words else "paris is the [MASK] of france"


def _seq2seq_probe(model: nn.Module, src_tok, sentence: str, target: str | None,
                   tgt_tok) -> Probe:
    """The source through the encoder, the target prefix through the decoder (teacher forcing:
    one pass, causal)."""
    from attnlab.explain.seq2seq import decoder_input
    from attnlab.explain.subject import make_subject

    source = make_subject(model, src_tok, sentence, "")
    tgt = decoder_input(model, tgt_tok, target)
    tokens = [piece(tgt_tok, int(i)) for i in tgt[0]]
    return Probe(model, "decoder", tokens, list(range(tgt.shape[1])),
                 lambda m: m(source.ids, tgt)[0], lambda i: piece(tgt_tok, int(i)), source.tokens)


def image_probe(model: nn.Module, image: Tensor, names: list[str] | None = None) -> Probe:
    """``image (1, C, H, W)`` through a ViT with a classifier, read at [CLS]; ``names`` the
    labels' names (default: their numbers)."""
    from attnlab.explain.readout import readout

    readout(model)
    model.patch_embed.check(image)
    tokens = ["[CLS]"] + [f"p{i}" for i in range(model.n_patches)]
    text = (lambda i: names[i]) if names else str
    return Probe(model, "encoder", tokens, [0], lambda m: m(image), text)


__all__ = ["Probe", "image_probe", "sentence_probe"]
