"""ELECTRA pretraining (attnlab.training.electra): the loss against a hand computation with a
fixed sample, no gradient from the detection loss into the generator, the shared embeddings,
the generator's shape, and a short run whose discriminator beats the all-"original" guess.
(The command and the exports to transformers: tests/cli/test_train_electra.py.)"""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attnlab import ModelConfig
from attnlab.data.mlm import MLMBatches
from attnlab.data.stream import MaskedLMBatch
from attnlab.errors import BadInput
from attnlab.tokenizers import WordPieceTokenizer
from attnlab.training.electra import (
    ElectraPretraining,
    ElectraRecipe,
    ReplacedTokenDetection,
    detection_scores,
    generator_config,
    ranking_auc,
)
from attnlab.training.recipes import run
from attnlab.training.schedule import LinearSchedule, schedule_to_dict
from attnlab.training.trainer import TrainConfig
from tests.criteria import train_until

# a small discriminator of electra-small's proportions: E = 16 lifted to 32, 2 heads
SMALL = dict(vocab_size=30, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=2,
             embedding_size=16, max_len=16, dropout=0.0, attention_dropout=0.0)
# a batch of two rows, the second padded; 4 selected positions ([MASK] = 4 there)
ORIGINAL = torch.tensor([[2, 7, 8, 9, 10, 11, 3], [2, 12, 13, 14, 3, 0, 0]])
SELECTED = torch.tensor([[0, 1, 0, 1, 0, 1, 0], [0, 0, 1, 0, 0, 0, 0]], dtype=torch.bool)
SAMPLE = torch.tensor([7, 20, 21, 13])  # row-major over SELECTED: 7 and 13 are the originals
# what the discriminator reads and its labels, written out by hand from the lines above
CORRUPTED = torch.tensor([[2, 7, 8, 20, 10, 21, 3], [2, 12, 13, 14, 3, 0, 0]])
REPLACED = torch.tensor([[0, 0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
ATTENTION = (ORIGINAL != 0).long()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def masked_batch() -> MaskedLMBatch:
    ids = torch.where(SELECTED, torch.tensor(4), ORIGINAL)
    labels = torch.where(SELECTED, ORIGINAL, torch.tensor(-100))
    return MaskedLMBatch(ids, torch.zeros_like(ids), ATTENTION, labels, torch.zeros(2))


def pair(sample=None, **kw) -> ElectraPretraining:
    torch.manual_seed(0)
    model = ElectraPretraining(ModelConfig.from_preset("electra-small", **{**SMALL, **kw}))
    if sample is not None:
        model.sample = sample
    return model.eval()


def fixed_sample(logits: torch.Tensor) -> torch.Tensor:
    assert logits.shape == (4, 30)  # the generator's logits at the selected positions
    return SAMPLE


def test_loss_is_mlm_plus_fifty_times_the_detection_cross_entropy():
    model, batch = pair(fixed_sample), masked_batch()
    _, _, replaced = model(*batch[:3], batch.labels)
    assert torch.equal(replaced, REPLACED)  # a sample equal to the original is "original"
    sums = ReplacedTokenDetection().loss(model, batch)
    with torch.no_grad():
        # the generator over every position, then the selected ones; the discriminator on the
        # hand-written corrupted text
        gen = model.generator(batch.ids, batch.token_type_ids, ATTENTION)[SELECTED]
        mlm = F.cross_entropy(gen, ORIGINAL[SELECTED])  # mean over the 4 selected
        z = model.discriminator(CORRUPTED, batch.token_type_ids, ATTENTION)
    y, real = REPLACED.float(), ATTENTION.bool()
    bce = -(y * torch.log(torch.sigmoid(z)) + (1 - y) * torch.log(1 - torch.sigmoid(z)))
    rtd = bce[real].mean()  # over the 12 real tokens, [CLS] and [SEP] included
    assert sums.tokens == 4 and int(real.sum()) == 12
    assert torch.allclose(sums.nll / 4, mlm, atol=1e-5)
    assert torch.allclose(sums.loss / sums.tokens, mlm + 50 * rtd, atol=1e-4)
    weighted = ReplacedTokenDetection(rtd_weight=2.0).loss(model, batch)
    assert torch.allclose(weighted.loss / 4, mlm + 2 * rtd, atol=1e-5)


def test_detection_loss_sends_no_gradient_into_the_generator():
    model = pair().train()  # the real sampler, dropout off
    batch = masked_batch()
    _, rtd_logits, replaced = model(*batch[:3], batch.labels)
    F.binary_cross_entropy_with_logits(rtd_logits[ATTENTION.bool()],
                                       replaced[ATTENTION.bool()].float()).backward()
    shared = {id(p) for p in model.discriminator.parameters()}
    own = [(n, p) for n, p in model.generator.named_parameters() if id(p) not in shared]
    assert own and all(p.grad is None or not p.grad.any() for _, p in own), \
        [n for n, p in own if p.grad is not None and p.grad.any()]
    assert model.discriminator.embed.weight.grad.abs().sum() > 0  # the shared table learns
    # the masked-LM loss does reach them: the check above could fail
    model.zero_grad()
    mlm_logits, _, _ = model(*batch[:3], batch.labels)
    F.cross_entropy(mlm_logits, ORIGINAL[SELECTED]).backward()
    assert all(p.grad is not None and p.grad.any() for n, p in own if "embed_proj" in n)


def test_embeddings_are_shared_and_both_losses_add_into_them():
    model, batch = pair(fixed_sample), masked_batch()
    d, g = model.discriminator, model.generator
    for name in ("embed", "positional", "segment", "embed_norm"):
        for p, q in zip(getattr(d, name).parameters(), getattr(g, name).parameters(),
                        strict=True):
            assert p is q and p.data_ptr() == q.data_ptr(), name
    assert g.mlm.weight is d.embed.weight  # the generator predicts against the shared table
    assert g.embed_proj.weight.shape == (8, 16) and d.embed_proj.weight.shape == (32, 16)
    table = d.embed.weight

    def grad_of(part):
        model.zero_grad()
        mlm_logits, rtd_logits, replaced = model(*batch[:3], batch.labels)
        real = ATTENTION.bool()
        losses = {"mlm": F.cross_entropy(mlm_logits, ORIGINAL[SELECTED]),
                  "rtd": F.binary_cross_entropy_with_logits(rtd_logits[real],
                                                            replaced[real].float())}
        sum(v for k, v in losses.items() if part in (k, "both")).backward()
        return table.grad.clone()

    mlm, rtd, both = grad_of("mlm"), grad_of("rtd"), grad_of("both")
    assert mlm.abs().sum() > 0 and rtd.abs().sum() > 0
    assert torch.allclose(both, mlm + rtd, atol=1e-6)


def test_generator_takes_a_quarter_of_width_heads_and_feed_forward():
    small = ModelConfig.from_preset("electra-small")
    g = generator_config(small)
    assert (g.d_model, g.n_heads, g.d_ff, g.embedding_size, g.head) == (64, 1, 256, 128, "mlm")
    assert g.n_encoder_layers == small.n_encoder_layers
    half = generator_config(small, 0.5)
    assert (half.d_model, half.n_heads, half.d_ff) == (128, 2, 512)
    # a discriminator without factorised embeddings: E = its width, the generator lifts it
    mini = generator_config(ModelConfig.from_preset("bert-mini"))
    assert (mini.d_model, mini.embedding_size) == (64, 256)
    assert generator_config(small, 1.0).embedding_size == 128  # E = 128 still lifted to 256
    with pytest.raises(BadInput, match="generator-size must be in"):
        generator_config(small, 0.0)
    with pytest.raises(BadInput, match="width 77 is not divisible by its 2 heads"):
        generator_config(replace(small, n_heads=8), 0.3)  # 76.8 and 2.4, rounded


def test_a_short_run_finds_the_replaced_tokens(tmp_path):
    # One line of 14 words, repeated: a row of 16 tokens is that line, so a token that is not
    # its position's word was replaced (and the generator, learning the line too, soon
    # samples the original, which then counts as original). The bar: most replacements
    # found, few originals flagged, accuracy above the all-"original" guess; a discriminator
    # that does not see the generator's tokens finds none. Rounds of 25 steps, resumed,
    # until it is met; the schedule spans the cap, so it does not depend on when that is.
    words = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
             "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + words))
    (tmp_path / "corpus.txt").write_text((" ".join(words[:14]) + "\n") * 300)
    model_config = ModelConfig.from_preset("electra-small", d_model=64, n_heads=2, d_ff=128,
                                           n_encoder_layers=2, embedding_size=32, dropout=0.0,
                                           attention_dropout=0.0)
    cap, rounds = 300, []

    def some_steps():
        train_config = TrainConfig(
            steps=25 * (len(rounds) + 1), label_smoothing=0.0, optimizer="adamw",
            weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6, progress=False, save_every=25,
            schedule=schedule_to_dict(LinearSchedule(2e-3, 30, cap)))
        recipe = ElectraRecipe(tmp_path / "corpus.txt", max_len=16, batch_size=32,
                               tokenizer=tmp_path / "vocab.txt", val_fraction=0.1)
        rounds.append(run(recipe, tmp_path / "run", model_config, train_config,
                          resume=bool(rounds), log=lambda *a: None).results)

    def finds_replacements():
        r = rounds[-1]
        baseline = 1 - r["rtd_replaced_share"]
        met = (r["rtd_replaced_accuracy"] >= 0.5 and r["rtd_original_accuracy"] >= 0.95
               and r["rtd_accuracy"] > baseline
               and r["rtd_replaced_share"] * r["rtd_tokens"] >= 20)
        return met, (f"{r['rtd_replaced_accuracy']:.4f} of {r['rtd_replaced_share']:.2%} "
                     f"replaced found, {r['rtd_original_accuracy']:.4f} of originals kept; "
                     f"accuracy {r['rtd_accuracy']:.4f} against the all-original {baseline:.4f}")

    train_until(some_steps, finds_replacements, "ELECTRA pretraining", every=1,
                cap=cap // 25, unit="rounds of 25 steps")
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


def test_detection_scores_count_real_tokens_by_hand():
    """The scores of a discriminator whose decisions are known: every token called
    replaced."""
    model, batch = pair(fixed_sample), masked_batch()
    torch.nn.init.constant_(model.discriminator.discriminator.out.bias, 100.0)
    torch.nn.init.zeros_(model.discriminator.discriminator.out.weight)
    r = detection_scores(model, [batch], torch.device("cpu"))
    # 12 real tokens, 2 of them replaced (REPLACED): all called replaced
    # and every logit the same: the ranking is a coin, AUC one half
    assert r == pytest.approx({"rtd_accuracy": 2 / 12, "rtd_replaced_accuracy": 1.0,
                 "rtd_original_accuracy": 0.0, "rtd_replaced_share": 2 / 12,
                 "rtd_tokens": 12.0, "rtd_auc": 0.5})


def test_ranking_auc_is_scikit_learns_with_ties():
    sklearn = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    truth = torch.rand(400, generator=g) < 0.2
    scores = (torch.randn(400, generator=g) + truth * 0.8).round(decimals=1)  # many ties
    assert ranking_auc(scores, truth) == pytest.approx(
        sklearn.roc_auc_score(truth.numpy(), scores.numpy()), abs=1e-12)
    assert ranking_auc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 1])) == 1.0
    assert ranking_auc(torch.tensor([3.0, 2.0]), torch.tensor([0, 1])) == 0.0
    assert math.isnan(ranking_auc(torch.ones(3), torch.zeros(3)))


def test_masking_is_train_mlm_s(tmp_path):
    """The batches are data/mlm.py's: the recipe's stream is an MLMBatches at 15%."""
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + [f"w{i}" for i in range(40)]))
    tok = WordPieceTokenizer.from_file(tmp_path / "vocab.txt")
    (tmp_path / "corpus.txt").write_text("\n".join(
        " ".join(f"w{(i + j) % 40}" for j in range(5)) for i in range(40)))
    recipe = ElectraRecipe(tmp_path / "corpus.txt", max_len=12, batch_size=4,
                           tokenizer=tmp_path / "vocab.txt")
    config = TrainConfig(steps=1, progress=False)
    prepared = recipe.prepare(ModelConfig.from_preset("electra-small", **SMALL), config)
    assert isinstance(prepared.batches, MLMBatches) and prepared.batches.select == 0.15
    assert prepared.config.head == "discriminator" and prepared.config.vocab_size == 45
    assert tok.vocab_size == 45
