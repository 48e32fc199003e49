"""One configuration for every model family (encoder–decoder, GPT, BERT, Llama-style, ViT).

A family is a choice of the same few knobs: where position enters, which norm and where,
which nonlinearity, biases or not. Presets name the published choices; any field can be
overridden: ``ModelConfig.from_preset("base", dropout=0.0)``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.errors import BadInput
from attnlab.files import parse_json, read_json
from attnlab.presets import PRESETS

CHOICES = {
    "arch": ("encoder-decoder", "decoder", "encoder", "vision"),
    "positional": ("sinusoidal", "sinusoidal-split", "learned", "rope", "alibi", "relative",
                   "none"),
    "norm": ("layernorm", "rmsnorm"),
    "norm_placement": ("post", "pre"),
    "activation": ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"),
    "head": ("none", "mlm", "pretraining", "classify", "tokens", "qa", "discriminator",
             "choice"),
}
_ROPE_OPTIONAL = ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                  "attention_factor", "mscale", "mscale_all_dim")
GATED = ("swiglu", "geglu")  # activations with a gated third matrix: act(x·W₁) ⊙ x·W₃
POOLED_HEADS = ("none", "pretraining", "classify", "choice")  # the heads reading the tanh pooler
# HF's rope_scaling types (rope_parameters' "rope_type") and the fields each one needs
ROPE_SCALING = {"linear": ("factor",), "dynamic": ("factor", "original_max_position_embeddings"),
                "yarn": ("factor", "original_max_position_embeddings"),
                "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
                           "high_freq_factor")}


_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
# Fields that must be at least this much (the layer counts may be 0: BERT has no decoder).
_AT_LEAST = dict(vocab_size=1, tgt_vocab_size=1, d_model=1, n_heads=1, num_kv_heads=1, d_ff=1,
                 n_encoder_layers=0, n_decoder_layers=0, max_len=1, block_size=1, dropout=0.0,
                 attention_dropout=0.0, activation_dropout=0.0, norm_eps=0.0, num_labels=1,
                 image_size=1, patch_size=1, num_channels=1, relative_buckets=2,
                 relative_max_distance=1, sliding_window=1, head_dim=1, embedding_size=1,
                 position_offset=0)
_VISION_HEADS = ("classify", "none")  # the ViT's heads: logits from [CLS], or hidden states


def check_at_least(obj: Any, minimums: dict[str, float], what: str = "") -> None:
    """Raise ``ValueError`` naming the first field of ``obj`` below its minimum (None passes)."""
    for name, low in minimums.items():
        value = getattr(obj, name)
        if value is not None and not value >= low:  # `not >=` also rejects NaN
            raise BadInput(f"{what}{name} must be >= {low}, got {value!r}")


def check_token_id(value: Any, vocab_size: int | None, what: str) -> None:
    """Raise ``BadInput`` unless ``value`` is a token id of a vocabulary of ``vocab_size``
    (None: any id an int64 holds; 2^63 or -1 would overflow it or index from the end)."""
    bound = 2**63 if vocab_size is None else vocab_size
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
        expected = ("a whole number in [0, 2^63)" if vocab_size is None
                    else f"0..{vocab_size - 1}, the model's vocabulary")
        raise BadInput(f"{what}={value!r} is not a token id: expected {expected}")


def check_types(obj: Any, what: str = "") -> None:
    """Raise ``ValueError`` when a dataclass field of type int/float/bool/str (or ``| None``)
    holds something else, e.g. a string from ``--set d_model=abc``."""
    for f in dataclasses.fields(obj):
        kind, _, rest = str(f.type).partition(" | ")
        value = getattr(obj, f.name)
        if kind not in _TYPES or (value is None and rest == "None"):
            continue
        if not isinstance(value, _TYPES[kind]) or (kind != "bool" and isinstance(value, bool)):
            raise BadInput(f"{what}{f.name}={value!r}: expected {f.type}")


@dataclass
class ModelConfig:
    """Architecture hyper-parameters. Defaults are the paper's base model (Table 3)."""

    arch: str = "encoder-decoder"
    vocab_size: int = 37000  # shared source/target BPE vocabulary (paper, section 5.1)
    tgt_vocab_size: int | None = None  # None: the target shares vocab_size
    d_model: int = 512
    n_heads: int = 8
    num_kv_heads: int | None = None  # None: = n_heads (no grouped-query attention)
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1  # on each sublayer output and on embeddings + positions
    attention_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # inside the feed-forward, after the nonlinearity
    max_len: int = 1024  # longest sequence the positional encoding covers
    # the sequence length it was trained on (`train lm --block`); generation keeps its context
    # within it, as nanoGPT does. None: not recorded (pretrained models), max_len applies
    block_size: int | None = None
    positional: str = "sinusoidal"
    rope_base: float = 10000.0
    # RoPE for contexts longer than training, as HF's rope_scaling: {"rope_type": "linear" |
    # "dynamic" | "yarn" | "llama3", "factor": ..., ...} (nn/positional.py gives each formula)
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    # T5's bucketed relative position bias (positional="relative"): buckets and the distance
    # from which every bucket is logarithmic
    relative_buckets: int = 32
    relative_max_distance: int = 128
    # Mistral: query i attends keys j with i − W < j ≤ i (a band), decoded with a rolling cache
    # of W entries per layer; None: the full causal context
    sliding_window: int | None = None
    # Longformer (encoders): each token attends attention_window / 2 tokens each side and the
    # global tokens (attnlab.nn.longformer); an even int, or a list of one a layer; None: all
    attention_window: list[int] | int | None = None
    head_dim: int | None = None  # d_k when h·d_k ≠ d_model (T5 v1.1); None: d_model / h
    scale_attention: bool = True  # scores / √d_k; T5 folds the scale into its initialisation
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_placement: str = "post"
    final_norm: bool | None = None  # None: a final norm exactly when norm_placement == "pre"
    activation: str = "relu"
    bias: bool = True
    qkv_bias: bool | None = None  # on Q, K, V alone (ViT's qkv_bias); None: as bias
    fused_qkv: bool = False
    scale_embeddings: bool = True  # × √d_model (paper, section 3.4)
    tie_embeddings: bool = True  # source = target embedding = output projection (section 3.4)
    # an encoder–decoder with one vocabulary and an untied head: one embedding matrix for both
    # stacks all the same (T5 v1.1, Flan-T5); tied models share it anyway
    share_embeddings: bool = False
    output_bias: bool = False  # a bias on the output projection (Marian's final_logits_bias)
    scale_tied_logits: bool = False  # T5: logits = (h · d_model^-½) · Eᵀ with a tied head
    type_vocab_size: int = 0  # segment (token-type) embeddings, BERT's sentence A/B; 0: none
    embedding_norm: bool = False  # LayerNorm over the summed embeddings (BERT)
    # factorised embeddings (ALBERT, ELECTRA): tokens embed in embedding_size dimensions, then a
    # linear map lifts them to d_model; None: embeddings are d_model wide
    embedding_size: int | None = None
    share_layers: bool = False  # one layer's weights applied n times (ALBERT)
    # RoBERTa: real tokens take positions position_offset, position_offset + 1, ... and pads
    # take pad_id (position_offset = pad_id + 1); 0: positions 0, 1, ... for every token
    position_offset: int = 0
    pooler: bool = True  # BERT's tanh pooler over [CLS] (DistilBERT, ELECTRA: none)
    head: str = "none"  # encoder-only task head: mlm, pretraining (mlm + nsp), classify, tokens
    num_labels: int = 2  # classes of the classify / tokens heads
    # the Vision Transformer (arch="vision"): square images of image_size² pixels and
    # num_channels channels, cut into (image_size / patch_size)² patches of patch_size² pixels
    image_size: int | None = None
    patch_size: int | None = None
    num_channels: int = 3
    # attention heads removed by pruning: "blocks.layers.3.self_attn" -> the original indices
    # of its heads that are gone (as HF's pruned_heads); the others keep their width d_k
    pruned_heads: dict[str, list[int]] = field(default_factory=dict)
    # LoRA or bottleneck adapters over the frozen model (attnlab.nn.adapters); {}: none
    adapter: dict[str, Any] = field(default_factory=dict)
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    extra: dict[str, Any] = field(default_factory=dict)  # family-specific, kept for round-trips

    def __post_init__(self) -> None:
        check_types(self, "config field ")
        check_at_least(self, _AT_LEAST, "config field ")
        # bounded by the vocabulary where a saved folder is read (storage.read_config,
        # interop.huggingface): a config being built may take a tokenizer's ids after this
        for name in ("pad_id", "unk_id", "bos_id", "eos_id"):
            check_token_id(getattr(self, name), None, f"config field {name}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not getattr(self, name) < 1:
                raise BadInput(f"config field {name} must be < 1, got {getattr(self, name)!r}")
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise BadInput(f"config field {name}={value!r}: expected one of {allowed}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise BadInput(
                f"config: d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.n_heads % self.kv_heads:
            raise BadInput(
                f"config: n_heads={self.n_heads} is not divisible by num_kv_heads={self.kv_heads}"
            )
        if self.positional == "rope" and self.d_k % 2:  # RoPE rotates pairs of dimensions
            raise BadInput(f"config: positional='rope' needs an even head width, got "
                           f"d_k = d_model / n_heads = {self.d_k}")
        if self.arch == "encoder" and self.activation in GATED:
            raise BadInput(f"config: activation={self.activation!r} is not supported by BERT "
                           "(arch='encoder')")
        self._check_positions()
        windows = self.attention_windows
        if windows is not None and (self.arch != "encoder" or len(windows) != self.n_encoder_layers
                                    or not all(type(w) is int and w > 0 and not w % 2
                                               for w in windows)):
            raise BadInput(f"config field attention_window={self.attention_window!r}: expected an "
                           f"even positive int or one a layer ({self.n_encoder_layers}), for "
                           f"arch='encoder'")
        if self.arch == "vision":
            self._check_vision()
        self._check_pruned_heads()
        if self.adapter:
            check_adapter(self.adapter)

    def _check_positions(self) -> None:
        """rope_scaling only with RoPE, with a known type and its fields; a sliding window only
        for a decoder whose positions need no score bias of their own."""
        if self.rope_scaling:
            kind = self.rope_scaling.get("rope_type") if isinstance(self.rope_scaling, dict) \
                else None
            if self.positional != "rope":
                raise BadInput(f"config: rope_scaling needs positional='rope', got "
                               f"{self.positional!r}")
            if kind not in ROPE_SCALING:
                raise BadInput(f"config field rope_scaling: rope_type={kind!r}, expected one of "
                               f"{tuple(ROPE_SCALING)}")
            for name in ROPE_SCALING[kind]:
                value = self.rope_scaling.get(name)
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not value > 0:
                    raise BadInput(f"config field rope_scaling: {kind} needs a positive "
                                   f"{name}, got {value!r}")
            for name in _ROPE_OPTIONAL:  # yarn's optional numbers (mscale 0: unset)
                value = self.rope_scaling.get(name)
                if value is not None and (isinstance(value, bool) or not isinstance(
                        value, (int, float)) or not value >= 0):
                    raise BadInput(f"config field rope_scaling: {name} must be a number >= 0, "
                                   f"got {value!r}")
            if not isinstance(self.rope_scaling.get("truncate", True), bool):
                raise BadInput(f"config field rope_scaling: truncate must be true or false, got "
                               f"{self.rope_scaling['truncate']!r}")
            unknown = set(self.rope_scaling) - {"rope_type", *ROPE_SCALING[kind],
                                                *_ROPE_OPTIONAL, "truncate"}
            if unknown:
                raise BadInput(f"config field rope_scaling: unknown field(s) "
                               f"{', '.join(sorted(unknown))} for {kind}")
            if kind == "llama3" and not (self.rope_scaling["high_freq_factor"]
                                         > self.rope_scaling["low_freq_factor"]):
                raise BadInput("config field rope_scaling: llama3 needs high_freq_factor > "
                               "low_freq_factor")
            if kind in ("yarn", "dynamic") and (self.rope_base <= 1 or self.d_k < 4):
                # their formulas divide by log(base) and by d − 2
                raise BadInput(f"config: rope_scaling {kind} needs rope_base > 1 and d_k >= 4, "
                               f"got {self.rope_base} and {self.d_k}")
        buckets, distance = self.relative_buckets, self.relative_max_distance
        if self.positional == "relative" and (buckets < 4 or distance <= buckets // 2):
            # each direction needs exact buckets (buckets/4 of them) and room for log ones
            raise BadInput(f"config: relative_buckets must be >= 4 and relative_max_distance > "
                           f"relative_buckets / 2, got {self.relative_buckets} and "
                           f"{self.relative_max_distance}")
        if self.share_layers and self.arch != "encoder":
            # the encoder–decoder's decoder would not share, and no decoder or ViT family
            # stores one shared layer: weights saved per layer would be written once
            raise BadInput(f"config: share_layers (ALBERT) is for encoders (arch='encoder'), "
                           f"got arch={self.arch!r}")
        if self.sliding_window is not None and (self.arch != "decoder"
                                                or self.positional in ("alibi", "relative")):
            raise BadInput(f"config: sliding_window is for decoders without a score bias, got "
                           f"arch={self.arch!r}, positional={self.positional!r}")
        if self.positional == "relative" and self.arch != "encoder-decoder":
            raise BadInput(f"config: positional='relative' (T5) is for encoder-decoders, got "
                           f"arch={self.arch!r}")

    def _check_pruned_heads(self) -> None:
        if not isinstance(self.pruned_heads, dict):
            raise BadInput(f"config field pruned_heads must map attention layers to head "
                           f"lists, got {self.pruned_heads!r}")
        for path, heads in self.pruned_heads.items():
            if (not isinstance(heads, list) or not heads or len(set(heads)) != len(heads)
                    or not all(isinstance(h, int) and not isinstance(h, bool)
                               and 0 <= h < self.n_heads for h in heads)):
                raise BadInput(f"config field pruned_heads[{path!r}]={heads!r}: expected "
                               f"distinct head indices in 0..{self.n_heads - 1}")
            if len(heads) >= self.n_heads:
                raise BadInput(f"config field pruned_heads[{path!r}] removes all "
                               f"{self.n_heads} heads; a layer keeps at least one")
            if self.kv_heads != self.n_heads:
                raise BadInput("config field pruned_heads: heads are pruned only without "
                               "grouped-query attention (num_kv_heads = n_heads)")
            if self.share_layers:
                raise BadInput("config field pruned_heads: heads are not pruned from shared "
                               "layers (share_layers=True)")

    def _check_vision(self) -> None:
        """A ViT needs its image and patch sizes (the patches tile the image), learned
        positions (one per patch and one for [CLS]) and a head it has."""
        if self.image_size is None or self.patch_size is None:
            raise BadInput("config: arch='vision' needs image_size and patch_size, got "
                           f"image_size={self.image_size}, patch_size={self.patch_size}")
        if self.image_size % self.patch_size:
            raise BadInput(f"config: image_size={self.image_size} is not divisible by "
                           f"patch_size={self.patch_size}")
        if self.positional != "learned":
            raise BadInput(f"config: arch='vision' needs positional='learned', got "
                           f"{self.positional!r}")
        if self.head not in _VISION_HEADS:
            raise BadInput(f"config: arch='vision' has head {' or '.join(_VISION_HEADS)}, got "
                           f"{self.head!r}")
        if self.activation == "swiglu":
            raise BadInput("config: activation='swiglu' is not supported by ViT (arch='vision')")

    @property
    def d_k(self) -> int:
        """Per-head width d_k = d_v = d_model / h (``head_dim`` when given)."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def n_patches(self) -> int:
        """N = (image_size / patch_size)², the patches of one image (0 without a vision
        config); a ViT's sequence is N + 1 long, [CLS] first."""
        if self.image_size is None or self.patch_size is None:
            return 0
        return (self.image_size // self.patch_size) ** 2

    @property
    def biased_qkv(self) -> bool:
        """Whether the query, key and value projections have biases (``qkv_bias``, else
        ``bias``); the output projection follows ``bias``."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def pre_norm(self) -> bool:
        return self.norm_placement == "pre"

    @property
    def use_final_norm(self) -> bool:
        return self.pre_norm if self.final_norm is None else self.final_norm

    @property
    def context(self) -> int | None:
        """The most positions a generated sequence's context may span: the trained
        ``block_size``, else ``max_len`` (None for ALiBi and no positional encoding, which
        extrapolate and were not trained at a recorded length)."""
        if self.block_size is not None:
            return min(self.block_size, self.max_len)
        return None if self.extrapolates else self.max_len

    @property
    def attention_windows(self) -> list[int] | None:
        """Longformer's window of each encoder layer; None: full attention."""
        w = self.attention_window
        return w if w is None or isinstance(w, list) else [w] * self.n_encoder_layers

    @property
    def reads_long_documents(self) -> bool:
        """Whether attention's memory grows linearly in the length (Longformer's band and
        global tokens), so that one pass reads a whole document up to ``max_len``."""
        return self.attention_window is not None

    @property
    def extrapolates(self) -> bool:
        """Positions with no table to run out of: ALiBi, T5's relative bias, none."""
        return self.positional in ("alibi", "relative", "none")

    def check_length(self, n_tokens: int, what: str = "sequence") -> None:
        """The max-length rule, the one place it lives: a sequence may hold at most
        ``max_len`` positions, the last one the positional encoding covers. ALiBi and no
        positional encoding extrapolate, so they have no such limit. The error reads
        "{what} of {n_tokens} tokens exceeds the model's context max_len=..."."""
        if not self.extrapolates and n_tokens > self.max_len:
            raise BadInput(f"{what} of {n_tokens} tokens exceeds the model's context "
                           f"max_len={self.max_len}")

    # --- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadInput(f"unknown config field(s): {', '.join(unknown)}")
        return cls(**data)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> ModelConfig:
        """From a JSON string or a path to a JSON file."""
        if str(source).lstrip().startswith("{"):
            return cls.from_dict(parse_json(str(source), "config", "JSON in config"))
        return cls.from_dict(read_json(source, "JSON in config", "config file"))

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        if name not in PRESETS:
            raise BadInput(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        values = {**PRESETS[name], **overrides}
        # a special id past a smaller vocabulary moves to its last id, where GPT-2 keeps its
        # one special token (<|endoftext|>, 50256 of 50257); a tokenizer's ids replace it
        for key in ("pad_id", "unk_id", "bos_id", "eos_id"):
            vocab = values.get("vocab_size", cls.vocab_size)
            if key not in overrides and isinstance(vocab, int) and values.get(key, 0) >= vocab > 0:
                values[key] = vocab - 1
        return cls.from_dict(values)


ADAPTER_METHODS = ("lora", "bottleneck")
_ADAPTER_FIELDS = {"lora": {"r", "alpha", "dropout"}, "bottleneck": {"size", "activation"}}


def check_adapter(spec: Any, where: str = "config field adapter") -> None:
    """An adapter spec (:mod:`attnlab.nn.adapters`) as a config may hold it, from an untrusted
    file: a known method, its numbers in range, module paths as lists of strings."""
    def bad(what: str) -> BadInput:
        return BadInput(f"{where}: {what}")

    if not isinstance(spec, dict):
        raise bad(f"expected an object, got {spec!r}")
    method = spec.get("method")
    if method not in ADAPTER_METHODS:
        raise bad(f"method={method!r}, expected one of {ADAPTER_METHODS}")
    unknown = set(spec) - {"method", "modules", "trainable", "targets", *_ADAPTER_FIELDS[method]}
    if unknown:
        raise bad(f"unknown field(s) {', '.join(sorted(unknown))} for {method}")
    for name in ("modules", "trainable", "targets"):
        value = spec.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad(f"{name} must be a list of names, got {value!r}")
    if not spec.get("modules"):
        raise bad("modules is empty: no layer to adapt")
    size = spec.get("r" if method == "lora" else "size")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 65536:
        raise bad(f"{'r' if method == 'lora' else 'size'} must be a whole number in "
                  f"1..65536, got {size!r}")
    if method == "lora":
        alpha, dropout = spec.get("alpha"), spec.get("dropout", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) \
                or not 0 < alpha < 1e6:
            raise bad(f"alpha must be a number in (0, 1e6), got {alpha!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0 <= dropout < 1:
            raise bad(f"dropout must be in [0, 1), got {dropout!r}")
    elif spec.get("activation", "relu") not in ("relu", "gelu", "gelu_tanh", "silu"):
        raise bad(f"activation={spec.get('activation')!r}, expected relu, gelu, gelu_tanh or "
                  "silu")
