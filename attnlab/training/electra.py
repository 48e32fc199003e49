"""ELECTRA pretraining (Clark et al., 2020): replaced-token detection.

A small generator G learns masked-LM; a discriminator D learns which tokens G replaced:

    x^m   = mask(x)                       15% of real tokens selected (data/mlm.py's masking)
    p_G   = softmax(G(x^m)_i)             (n_selected, vocab), at the selected positions i
    x̂_i   ~ p_G                           sampled, no gradient through the sample
    x̃     = x with x̂_i at each selected i (batch, seq): the discriminator's input
    y_i   = 1[x̃_i ≠ x_i]                  a sample equal to the original is "original" (0)
    L     = L_MLM(G) + λ · L_RTD(D)       λ = 50 (the paper's)
    L_RTD = mean over non-pad i of BCE(σ(D(x̃)_i), y_i)

The sample is discrete, so D's loss cannot reach G's own weights (the paper trains G by
maximum likelihood only, not adversarially); it does reach the embeddings the two share.

**The generator**: the discriminator's config with ``size`` (default 1/4) of its hidden size,
heads and feed-forward width, and the same number of layers (the paper's smaller
generators), as :func:`generator_config` makes it.

**Shared embeddings**: the token, position and token-type tables and the LayerNorm over
their sum, E wide, are the same modules in both models, as in Google's code (one
``electra/embeddings`` scope). Each model lifts E to its own width with its own projection
(HF's ``embeddings_project``; E = the discriminator's ``embedding_size``, or its d_model when
it has none); the generator's MLM head predicts in E dimensions against the shared token
table. So each model alone is an ordinary attnlab BERT, and the discriminator saves as
transformers' ``ElectraForPreTraining`` and the generator as its ``ElectraForMaskedLM``
(``attnlab.save_pretrained``) with nothing to convert.

A run (``attnlab train electra``) checkpoints the pair (for ``--resume``); ``final/`` is the
discriminator alone, what ``attnlab.load`` and ``train classify --init`` read, and
``generator/`` the generator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.data.mlm import IGNORE
from attnlab.data.stream import MaskedLMBatch, to_device
from attnlab.errors import BadInput
from attnlab.storage import FINAL, save_model_dir
from attnlab.training.loss import LossSums, label_smoothed_loss
from attnlab.training.recipes import MLMRecipe, Prepared
from attnlab.training.trainer import TrainConfig

GENERATOR = "generator"  # the run folder's generator model folder, beside final/


def generator_config(config: ModelConfig, size: float = 0.25) -> ModelConfig:
    """The generator of a discriminator ``config``: ``size`` × its d_model, heads and d_ff
    (at least 1 each), the same layers, an MLM head, and its embeddings E wide (E = the
    discriminator's embedding width), lifted to its own width when that differs."""
    if not 0 < size <= 1:
        raise BadInput(f"--generator-size must be in (0, 1], got {size}")
    width = config.embedding_size or config.d_model
    d, heads = max(1, round(config.d_model * size)), max(1, round(config.n_heads * size))
    if d % heads:
        raise BadInput(f"--generator-size {size}: the generator's width {d} is not divisible "
                       f"by its {heads} heads")
    return dataclasses.replace(config, d_model=d, n_heads=heads, num_kv_heads=None,
                               d_ff=max(1, round(config.d_ff * size)),
                               embedding_size=width if width != d else None, head="mlm",
                               pooler=False)


def sample_replacements(logits: Tensor) -> Tensor:
    """One token from ``softmax(logits)`` per row: ``(n, vocab)`` -> ``(n,)`` (the global
    RNG, which checkpoints restore)."""
    return torch.multinomial(logits.detach().float().softmax(-1), 1).squeeze(-1)


class ElectraPretraining(nn.Module):
    """The generator and the discriminator (``config``, head ``discriminator``), their
    embeddings shared. ``sample`` draws the replacements (a test may fix it)."""

    def __init__(self, config: ModelConfig, generator_size: float = 0.25):
        super().__init__()
        self.config = dataclasses.replace(config, head="discriminator")
        self.discriminator = build_model(self.config)
        self.generator = build_model(generator_config(self.config, generator_size))
        d, g = self.discriminator, self.generator
        # the same modules: one set of parameters, which both losses' gradients add into
        g.embed, g.positional, g.segment, g.embed_norm = (d.embed, d.positional, d.segment,
                                                          d.embed_norm)
        g.mlm.weight = d.embed.weight  # the generator's output matrix is the shared table
        self.sample: Callable[[Tensor], Tensor] = sample_replacements

    def forward(self, ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor,
                labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A masked batch (``ids`` masked, ``labels`` the originals at the selected positions,
        -100 elsewhere; ``(batch, seq)`` each) -> the generator's logits at the selected
        positions ``(n_selected, vocab)``, the discriminator's logits ``(batch, seq)`` on the
        corrupted text, and which tokens were replaced ``(batch, seq)`` bool."""
        selected = labels != IGNORE
        mlm_logits = self.generator(ids, token_type_ids, attention_mask,
                                    masked_positions=selected)
        with torch.no_grad():
            sampled = self.sample(mlm_logits)
        original = torch.where(selected, labels, ids)
        corrupted = original.masked_scatter(selected, sampled.to(original.dtype))
        replaced = corrupted != original  # a sample equal to the original counts as original
        return (mlm_logits, self.discriminator(corrupted, token_type_ids, attention_mask),
                replaced)


class ReplacedTokenDetection:
    """The objective: ``L_MLM + λ·L_RTD`` per selected token (the trainer divides the sums by
    the selected tokens, so λ·L_RTD enters scaled by their count). ``nll`` is the generator's,
    so perplexity and the validation loss are its masked-LM ones."""

    def __init__(self, rtd_weight: float = 50.0):
        self.rtd_weight = rtd_weight

    def target_tokens(self, batch: MaskedLMBatch) -> int:
        return int((batch.labels != IGNORE).sum())

    def source_tokens(self, batch: MaskedLMBatch) -> int:
        return int(batch.attention_mask.sum())

    def loss(self, model: nn.Module, batch: MaskedLMBatch) -> LossSums:
        mlm_logits, rtd_logits, replaced = model(batch.ids, batch.token_type_ids,
                                                 batch.attention_mask, batch.labels)
        sums = label_smoothed_loss(mlm_logits, batch.labels[batch.labels != IGNORE], 0.0,
                                   pad_id=None)
        real = batch.attention_mask.bool()
        rtd = F.binary_cross_entropy_with_logits(rtd_logits[real].float(),
                                                 replaced[real].float())
        sums.loss = sums.loss + self.rtd_weight * rtd * sums.tokens
        return sums


def ranking_auc(scores: Tensor, truth: Tensor) -> float:
    """The probability that a random positive (``truth`` True) scores above a random negative,
    ties counted half: the Mann–Whitney U over ``n_pos · n_neg``, from average ranks (0.5:
    no better than chance; NaN without both kinds)."""
    _, inverse, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = ((ends - counts + 1 + ends) / 2)[inverse]  # 1-based, averaged over ties
    positive = truth.bool()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@torch.no_grad()
def detection_scores(model: ElectraPretraining, batches, device: torch.device,
                     seed: int = 0) -> dict[str, float]:
    """The discriminator's decisions (logit > 0: replaced) over the real tokens of
    ``batches``, its generator sampling from ``seed`` (the same replacements every call):
    accuracy on all tokens, on the replaced ones, on the original ones, the share replaced
    (the all-"original" guess scores 1 − that share), and the ranking AUC of its logits
    (:func:`ranking_auc`: whether it scores replaced tokens above originals, whatever its
    threshold)."""
    was_training = model.training
    model.eval()
    logits_seen, truth_seen = [], []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for b in batches:
            b = to_device(b, device)
            _, logits, replaced = model(b.ids, b.token_type_ids, b.attention_mask, b.labels)
            real = b.attention_mask.bool()
            logits_seen.append(logits[real].float().cpu())
            truth_seen.append(replaced[real].long().cpu())
    model.train(was_training)
    scores, truth = torch.cat(logits_seen), torch.cat(truth_seen)
    guess = (scores > 0).long()
    confusion = torch.bincount(truth * 2 + guess, minlength=4).view(2, 2)  # [truth, guess]
    total, by_truth = confusion.sum().clamp(min=1), confusion.sum(1).clamp(min=1)
    return {"rtd_accuracy": float(confusion.diag().sum() / total),
            "rtd_replaced_accuracy": float(confusion[1, 1] / by_truth[1]),
            "rtd_original_accuracy": float(confusion[0, 0] / by_truth[0]),
            "rtd_replaced_share": float(confusion[1].sum() / total),
            "rtd_tokens": float(confusion.sum()),
            "rtd_auc": ranking_auc(scores, truth)}


@dataclass
class ElectraRecipe(MLMRecipe):
    """``train mlm``'s data (one sentence a line, the last ``val_fraction`` validating, 15%
    masked), the generator and discriminator above, and the discriminator's scores on the
    validation batches at the end."""

    generator_size: float = 0.25
    rtd_weight: float = 50.0

    def prepare(self, model_config: ModelConfig, train_config: TrainConfig) -> Prepared:
        if self.nsp:
            raise BadInput("ELECTRA has no next-sentence prediction")
        if not self.rtd_weight >= 0:
            raise BadInput(f"--rtd-weight must be >= 0, got {self.rtd_weight}")
        if train_config.plan().sharded:  # a split pair would gather as one plain model
            raise BadInput("train electra shards no model: run it on one process or with "
                           "plain data parallelism (torchrun, no --parallel fsdp, --tp, --pp)")
        prepared = super().prepare(model_config, train_config)
        config = dataclasses.replace(prepared.config, head="discriminator")
        gen = generator_config(config, self.generator_size)
        return dataclasses.replace(
            prepared, config=config, task=ReplacedTokenDetection(self.rtd_weight),
            summary=f"{prepared.summary}; generator d_model {gen.d_model}, {gen.n_heads} "
                    f"heads, d_ff {gen.d_ff}; loss MLM + {self.rtd_weight:g}·RTD")

    def build(self, prepared: Prepared) -> nn.Module:
        return ElectraPretraining(prepared.config, self.generator_size)

    def finish(self, model: nn.Module, prepared: Prepared, out_dir: Path,
               rank: int) -> dict[str, float]:
        """``final/``: the discriminator; ``generator/``: the generator; the discriminator's
        :func:`detection_scores` on the validation batches."""
        if rank == 0:
            tokenizers = {k: t.to_dict() for k, t in prepared.tokenizers.items()}
            step = prepared.state["step"]
            save_model_dir(out_dir / FINAL, model.discriminator, model.discriminator.config,
                           tokenizers, step=step)
            save_model_dir(out_dir / GENERATOR, model.generator, model.generator.config,
                           tokenizers, step=step)
        return detection_scores(model, prepared.val_batches, next(model.parameters()).device)


__all__ = ["ElectraPretraining", "ElectraRecipe", "ReplacedTokenDetection",
           "detection_scores", "generator_config", "ranking_auc", "sample_replacements"]
