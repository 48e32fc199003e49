"""What ``attnlab explain`` follows: one sentence, one model, and the model's own run of it.

A :class:`Subject` holds the sentence's pieces and ids, the embedding stages computed from the
model's parameters, and :meth:`Subject.run_model`, which runs the model's *own* encoder forward
pass with hooks that record every layer's input, its self-attention output, its weights and
the layer's output. The walkthrough recomputes each stage by hand and compares with those.

Models that can be explained: a freshly initialised ``tiny`` encoder–decoder (its encoder;
sinusoidal positions), any BERT (``minilm``, a Hugging Face folder, an attnlab run), an
attnlab translation run (its encoder), and a decoder-only model with its tokenizer (GPT-2,
Llama, Mistral: the same layers run causally, and within the sliding window's band). Images
(a ViT's [CLS] and patches) are followed by :mod:`attnlab.explain.image`, whose subject has the
same :class:`EncoderInput` interface.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from attnlab.errors import BadInput


@dataclass
class OwnRun:
    """Tensors recorded from the model's own forward pass, per layer (batch index dropped)."""

    layer_inputs: list[Tensor] = field(default_factory=list)  # (seq, d_model)
    attention_outputs: list[Tensor] = field(default_factory=list)  # (seq, d_model)
    weights: list[Tensor] = field(default_factory=list)  # (heads, seq, seq)
    layer_outputs: list[Tensor] = field(default_factory=list)  # (seq, d_model)


@dataclass
class Subject:
    label: str
    model: nn.Module
    tokenizer: object
    sentence: str
    tokens: list[str]
    ids: Tensor  # (1, seq)
    token_embedding: Tensor  # E[ids] (· √d_model when the model scales), (seq, d_model)
    position_embedding: Tensor  # P[pos], (seq, d_model)
    segment_embedding: Tensor | None  # S[type] for BERT, else None
    x0: Tensor  # the encoder's input as the model computes it, (seq, d_model)
    x0_formula: str
    layers: nn.ModuleList
    positional: nn.Module
    positions: Tensor  # (seq,)
    mask: Tensor  # (seq, seq) boolean, True = may attend
    _forward: object = None
    mask_note: str = "one input, no padding: all True"  # what the mask stage shows

    @property
    def title(self) -> str:
        """What is followed, in a heading: the sentence."""
        return self.sentence

    @property
    def input_line(self) -> str:
        return f"sentence: {self.sentence!r}"

    def run_model(self) -> OwnRun:
        """The model's own encoder pass with need_weights, recorded by forward hooks."""
        return record_run(self.layers, self._forward)


class EncoderInput(Protocol):
    """What :func:`~attnlab.explain.walkthrough.layer_stages` reads: an encoder's input of
    ``seq`` positions (a sentence's tokens, or an image's [CLS] and patches), the encoder's
    layers, and the model's own run of it."""

    label: str
    model: nn.Module
    tokens: list[str]  # a name for each position, (seq,)
    layers: nn.ModuleList
    positional: nn.Module  # the positional encoding's hooks (rotate, attention_bias)
    positions: Tensor  # (seq,)
    mask: Tensor  # (seq, seq) boolean, True = may attend

    @property
    def title(self) -> str: ...

    @property
    def input_line(self) -> str: ...

    def run_model(self) -> OwnRun: ...


def record_run(layers: nn.ModuleList, forward: Callable[[], object],
               run: OwnRun | None = None) -> OwnRun:
    """Call ``forward()`` (the model's own pass, ``need_weights`` on) under no_grad, recording
    into ``run`` (a new :class:`OwnRun` by default) each layer's input, self-attention output,
    weights and output through forward hooks, removed afterwards."""
    run = OwnRun() if run is None else run

    def record_layer(module, args, out) -> None:  # hooks return None: output unchanged
        run.layer_inputs.append(args[0][0].detach())
        run.layer_outputs.append(out[0].detach())
        run.weights.append(module.attn_weights[0].detach())

    def record_attention(module, args, out) -> None:
        run.attention_outputs.append(out[0][0].detach())  # out = (output, weights)

    hooks = []
    for layer in dict.fromkeys(layers):  # a shared layer (ALBERT) is hooked once, runs N times
        hooks.append(layer.register_forward_hook(record_layer))
        hooks.append(layer.self_attn.register_forward_hook(record_attention))
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in hooks:
            h.remove()
    return run


def _tiny(sentences: list[str], seed: int):
    from attnlab.config import ModelConfig
    from attnlab.models import Transformer
    from attnlab.tokenizers import WordTokenizer

    tok = WordTokenizer.train(sentences)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.from_preset("tiny", vocab_size=max(tok.vocab_size, 8),
                                                dropout=0.0))
    return model.eval(), tok, f"tiny (freshly initialised, seed {seed}: random weights)"


class SubjectModel(NamedTuple):
    """A model to follow and how it reads and writes text."""

    model: nn.Module
    tokenizer: object  # what reads the sentence (an encoder–decoder's source side)
    label: str  # the model, in a heading
    source: object  # the folder or file read, or a phrase saying the model is random
    target_tokenizer: object  # what writes an encoder–decoder's output (else ``tokenizer``)


def load_subject_model(spec: str | None, sentences: list[str], seed: int = 0,
                       loaded=None) -> SubjectModel:
    """The model ``--model`` names: None (a random tiny model whose word vocabulary is
    ``sentences``), ``minilm``, or a folder; ``loaded``: ``spec`` already loaded
    (:func:`attnlab.storage.load`)."""
    if spec is None:
        model, tok, label = _tiny(sentences, seed)
        return SubjectModel(model, tok, label, f"a random tiny model (untrained, seed {seed})",
                            tok)
    from attnlab.storage import MINILM, load

    loaded = loaded or load(spec)
    if loaded.kind == "vision":
        raise BadInput(f"{spec}: a vision model (arch='vision') reads images, not sentences: "
                       "give --image digits:N, a .npy or a PNG file")
    tok = loaded.tokenizers.get("text") or loaded.tokenizers.get("source")
    if tok is None:
        raise BadInput(f"{spec}: explain needs the model's tokenizer, and the folder has none")
    label = "all-MiniLM-L6-v2 (pretrained)" if spec == MINILM else str(spec)
    return SubjectModel(loaded.model, tok, label, loaded.path,
                        loaded.tokenizers.get("target", tok))


def make_subject(model: nn.Module, tokenizer, sentence: str, label: str) -> Subject:
    """The sentence through ``model``'s embeddings, ready for the walkthrough."""
    from attnlab.models import BERT, GPT

    if isinstance(model, GPT):
        return _decoder_subject(model, tokenizer, sentence, label)
    with torch.no_grad():
        if isinstance(model, BERT):
            ids = torch.tensor([tokenizer.encode_single(sentence)])
            pieces = [tokenizer.backend.id_to_token(int(i)) for i in ids[0]]
            types = torch.zeros_like(ids)
            positions = model.positions(ids).reshape(-1)  # RoBERTa's start after its pad id
            seg = model.segment(types)[0] if model.segment is not None else None
            width = model.embed.weight.shape[1]  # E: ALBERT and ELECTRA embed narrower
            pos = model.positional.embed(torch.zeros(1, ids.shape[1], width), positions)[0]
            summed = model.embed(ids)[0] + pos + (0 if seg is None else seg)
            norm = model.embed_norm  # LayerNorm written out: γ ⊙ (x − μ) / √(σ² + ε) + β
            x0 = summed
            if isinstance(norm, nn.LayerNorm):
                mu = summed.mean(-1, keepdim=True)
                var = summed.var(-1, unbiased=False, keepdim=True)
                x0 = (summed - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias
            formula = "x₀ = LayerNorm(E[ids] + P[pos] + S[segment])"
            if model.embed_proj is not None:  # factorised: lifted from E to d_model
                x0 = model.embed_proj(x0)
                formula = "x₀ = W_e · LayerNorm(E[ids] + P[pos] + S[segment]) + b_e"

            def forward():
                model.encode(ids, types, torch.ones_like(ids), need_weights=True)

            layers, embed = model.encoder.layers, model.embed
        else:  # the encoder of an encoder–decoder
            ids = torch.tensor([tokenizer.encode(sentence, add_eos=True)])
            pieces = [piece(tokenizer, int(i)) for i in ids[0]]
            positions = torch.arange(ids.shape[1])
            pos = model.positional.embed(torch.zeros(1, ids.shape[1], model.config.d_model),
                                         positions)[0]
            seg = None
            x0 = model.src_embed(ids)[0] + pos
            formula = ("x₀ = E[ids]·√d_model + PE[pos]" if model.config.scale_embeddings
                       else "x₀ = E[ids] + PE[pos]")

            def forward():
                model.encode(ids, need_weights=True)

            layers, embed = model.encoder.layers, model.src_embed
        tok_emb = embed(ids)[0]
    seq = ids.shape[1]
    return Subject(label, model, tokenizer, sentence, pieces, ids, tok_emb, pos, seg, x0, formula,
                   layers, model.positional, positions, torch.ones(seq, seq, dtype=torch.bool),
                   forward)


def piece(tok, i: int) -> str:
    """Token ``i`` as the tokenizer writes it (its vocabulary's piece where it keeps one)."""
    vocab = getattr(tok, "vocab", None)
    if isinstance(vocab, list):  # (the tiny model has rows past a small word vocabulary)
        return vocab[i] if i < len(vocab) else f"#{i}"
    backend = getattr(tok, "backend", None)
    if backend is not None and hasattr(backend, "id_to_token"):
        name = backend.id_to_token(i)
        if name is not None and hasattr(tok, "mask_id"):  # WordPiece: its own pieces
            return name
    return tok.decode([i], skip_special=False)


def decoder_mask(seq: int, window: int | None) -> tuple[Tensor, str]:
    """A decoder's ``(seq, seq)`` mask and what it says: causal, and with a sliding window
    (Mistral) the band ``i − W < j ≤ i``."""
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    if window is None:
        return causal, "causal: query i may attend keys j <= i"
    band = causal.triu(-(window - 1))
    return band, f"sliding window W = {window}: query i may attend keys i - {window} < j <= i"


def _decoder_subject(model: nn.Module, tokenizer, sentence: str, label: str) -> Subject:
    """A decoder-only model (GPT-2, Llama, Mistral) reading ``sentence``: the same layers as
    an encoder, run causally (and within its window)."""
    with torch.no_grad():
        ids = torch.tensor([tokenizer.encode(sentence)])
        if ids.shape[1] == 0:
            raise BadInput("the sentence has no tokens")
        model.config.check_length(ids.shape[1])
        pieces = [tokenizer.decode([int(i)]) for i in ids[0]]
        seq = ids.shape[1]
        positions = torch.arange(seq)
        tok_emb = model.embed(ids)[0]
        pos = model.positional.embed(torch.zeros(1, seq, tok_emb.shape[-1]), positions)[0]
        additive = model.config.positional in ("learned", "sinusoidal", "sinusoidal-split")
        formula = ("x₀ = E[ids] + P[pos]" if additive else
                   f"x₀ = E[ids] ({model.config.positional}: position enters in attention)")

        def forward():
            model.features(ids, need_weights=True)

    mask, note = decoder_mask(seq, model.config.sliding_window)
    return Subject(label, model, tokenizer, sentence, pieces, ids, tok_emb, pos, None,
                   tok_emb + pos, formula, model.blocks.layers, model.positional, positions,
                   mask, forward, note)
