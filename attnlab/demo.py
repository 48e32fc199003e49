"""The main job (``make demo``): learn to translate English number words into German.

Needs no download: the corpus comes from :mod:`attnlab.data.numbers`. A small encoder–decoder
trains with the paper's recipe for a few minutes, is scored by exact match on numbers it never
saw, and leaves a checkpoint, a loss curve and a cross-attention heatmap under ``runs/demo``.

The recipe is sized for a 2-core CPU *in fp32*, which is what most machines train in (an
AVX2-only CPU emulates bf16, many times slower): 1,500 steps of about 4,800 tokens, Adam with
the paper's betas, a 300-step warmup to 2.5e-3 and then a cosine decay to zero at the last
step. Ending at a learning rate of zero is what makes 1,500 steps enough: with the paper's
inverse-square-root decay the rate is still 1.1e-3 at step 1,500 and the exact match wobbles
between checkpoints (docs/benchmarks.md).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from attnlab import hardware
from attnlab.config import ModelConfig
from attnlab.data import load_corpus
from attnlab.errors import BadInput
from attnlab.generation import cross_attention, exact_match, translate
from attnlab.storage import CHECKPOINTS, list_checkpoints
from attnlab.training.guard import RunLock
from attnlab.training.recipes import train_translation
from attnlab.training.schedule import CosineSchedule, schedule_to_dict
from attnlab.training.trainer import TrainConfig
from attnlab.viz import plot_cross_attention, plot_loss_curve

DEMO_MODEL = dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2, n_decoder_layers=2,
                  dropout=0.0, max_len=128)
EXAMPLES = ["forty-two", "seven hundred twenty-one thousand three hundred ninety-eight",
            "one thousand one", "ninety-nine thousand nine hundred nineteen"]


def run_demo(out_dir: str = "runs/demo", steps: int = 1500, time_budget: float | None = None,
             n_train: int = 200_000, n_test: int = 500, seed: int = 0,
             precision: str = "auto", device: str = "auto", log=print) -> dict:
    if steps < 1:
        raise BadInput(f"--steps must be >= 1, got {steps}")
    out = Path(out_dir)
    with RunLock(out):  # never clear a folder another demo or trainer is writing
        if (out / CHECKPOINTS).exists():  # the demo's own scratch folder: start afresh
            log(f"removing the previous demo run in {out}")
            shutil.rmtree(out / CHECKPOINTS)
        return _train_and_report(out, steps, time_budget, n_train, n_test, seed, precision,
                                 device, log)


def _train_and_report(out: Path, steps: int, time_budget: float | None, n_train: int,
                      n_test: int, seed: int, precision: str, device: str, log) -> dict:
    corpus = load_corpus("numbers", None, None, n_train, n_test, seed)
    log(f"numbers task: {len(corpus.train):,} training pairs, {len(corpus.test)} held-out "
        f"numbers never seen in training; training {steps} steps"
        + (f", or as many as fit in {time_budget:g} s (timed over the first steps; the "
           "schedule is planned for them)" if time_budget else ""))
    model_config = ModelConfig.from_preset("tiny", **DEMO_MODEL)
    train_config = TrainConfig(
        steps=steps, max_tokens=4096, precision=precision, device=device, seed=seed,
        save_every=500, keep_last=3, time_budget=time_budget,
        schedule=schedule_to_dict(CosineSchedule(peak_lr=2.5e-3, warmup=min(300, steps // 5),
                                                 total_steps=steps)),
    )
    start = time.perf_counter()
    model, toks, history = train_translation(corpus, out, model_config, train_config, log=log)
    train_time = time.perf_counter() - start
    device = next(model.parameters()).device
    with hardware.autocast(device, hardware.pick_precision(precision, device, warn=False)):
        accuracy, hyps = exact_match(model, toks["source"], toks["target"], corpus.test)
    log(f"\ntrained {history[-1]['step']} steps in {train_time:.0f} s "
        f"({history[-1]['tokens_per_s']:,.0f} tokens/s); final loss {history[-1]['loss']:.3f}")
    log(f"held-out exact match: {accuracy:.1%} of {len(corpus.test)} numbers\n")
    for (src, ref), hyp in list(zip(corpus.test, hyps, strict=True))[:5]:
        log(f"  {src}\n    -> {hyp}  {'✓' if hyp == ref else '✗ expected ' + ref}")
    for src, hyp in zip(EXAMPLES, translate(model, toks["source"], toks["target"], EXAMPLES),
                        strict=True):
        log(f"  {src}\n    -> {hyp}")
    curve = plot_loss_curve(out / "metrics.jsonl", out / "loss_curve.png")
    heatmap = cross_attention_heatmap(model, toks, EXAMPLES[1], out / "cross_attention.png")
    ckpt = list_checkpoints(out / CHECKPOINTS)[-1]
    log(f"\ncheckpoint:   {ckpt}\nloss curve:   {curve}\nheatmap:      {heatmap}\n"
        f"metrics:      {out / 'metrics.jsonl'}\n"
        f"try:          attnlab translate --model {out} \"{EXAMPLES[0]}\"")
    return {"accuracy": accuracy, "train_seconds": train_time, "steps": history[-1]["step"],
            "checkpoint": str(ckpt)}


def cross_attention_heatmap(model, toks, sentence: str, path: Path) -> Path:
    """Last decoder layer's cross-attention, averaged over heads, for one greedy translation."""
    weights, src, out = cross_attention(model, toks["source"], toks["target"], sentence)
    return plot_cross_attention(weights, src, out, path,
                                title="cross-attention, last layer (mean of heads)")
