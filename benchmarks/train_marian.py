"""Training tokens/s: attnlab's encoder–decoder vs transformers' MarianMTModel, side by side.

A Marian-shaped model (post-LN, sinusoidal positions, one shared tied vocabulary, swish, scaled
embeddings, output bias; attnlab's `small` preset's size by default) is built by transformers
from a config and converted into attnlab through ``attnlab.from_pretrained`` on the folder its
``save_pretrained`` wrote, so both start from the same weights. Both train with teacher
forcing on the same random token batches in the same order (source and target lengths
between ``len/2`` and ``len``, padded; the decoder reads the target shifted right after the
pad id, as Marian's ``decoder_start_token_id``), the same token-mean cross-entropy (padding
ignored), the same AdamW (side_by_side.optimizer, weight decay on matrices) and clipping 1.0.
Dropout is 0 so the two runs stay equal step for step; Marian's output bias is a buffer in
transformers, so attnlab's is frozen to match; transformers' embedding skips the pad row's
gradient (``padding_idx``) while attnlab's does not, and the pad id starts every decoder input,
so ``padding_idx`` is cleared on transformers' side (``--keep-padding-idx`` keeps it: the
losses then drift apart by ~1e-4). The two models alternate step by step in one
process (who goes first alternates too); warm-up steps are not timed. Tokens counted: real
(non-pad) source tokens plus target tokens predicted.

    .venv/bin/python benchmarks/train_marian.py [--precision fp32|bf16] [--steps 30]
        [--batch 64] [--len 32] [--threads 2]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import transformers

from attnlab import from_pretrained

sys.path.insert(0, str(Path(__file__).parent))
from side_by_side import (  # noqa: E402
    describe,
    profile_steps,
    report,
    timed_steps,
    training_arguments,
)

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def make_batches(n: int, batch: int, length: int, vocab: int, pad: int,
                 seed: int = 0) -> list[Batch]:
    """``(src, decoder input, labels)``: random ids in [1, pad) (0 is eos), padded at the end;
    the decoder input is the target shifted right after ``pad``; labels -100 at padding."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        src = torch.randint(1, pad, (batch, length), generator=g)
        tgt = torch.randint(1, pad, (batch, length), generator=g)
        for ids in (src, tgt):
            lens = torch.randint(length // 2, length + 1, (batch,), generator=g)
            ids[torch.arange(length)[None] >= lens[:, None]] = pad
        dec_in = torch.cat([torch.full((batch, 1), pad), tgt[:, :-1]], dim=1)
        out.append((src, dec_in, tgt.masked_fill(tgt == pad, -100)))
    return out


def logits_of(name: str, model: torch.nn.Module, src: torch.Tensor, dec_in: torch.Tensor,
              pad: int) -> torch.Tensor:
    if name == "transformers":
        return model(input_ids=src, attention_mask=(src != pad).long(),
                     decoder_input_ids=dec_in).logits
    return model(src, dec_in)  # attnlab masks source padding from its pad id


def main() -> None:
    p = training_arguments(__doc__, steps=30, batch=64, length=32, layers=3)
    p.add_argument("--keep-padding-idx", action="store_true",
                   help="keep transformers' padding_idx (no gradient to the pad embedding)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe())
    pad = args.vocab - 1  # Marian's pad is its last id; eos 0
    bf16 = args.precision == "bf16"
    torch.manual_seed(args.seed)
    hf_cfg = transformers.MarianConfig(
        vocab_size=args.vocab, decoder_vocab_size=args.vocab, d_model=args.d_model,
        encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ff, decoder_ffn_dim=args.ff, max_position_embeddings=512,
        activation_function="swish", scale_embedding=True, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=pad,
        decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=None)
    theirs = transformers.MarianMTModel(hf_cfg)
    for module in theirs.modules():  # attnlab's embedding has no padding_idx: train alike
        if isinstance(module, torch.nn.Embedding) and not args.keep_padding_idx:
            module.padding_idx = None
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards"
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = from_pretrained(folder)
    ours.lm_head.bias.requires_grad_(False)  # transformers' final_logits_bias is a buffer
    models = {"attnlab": ours, "transformers": theirs}
    total = args.warmup_steps + args.steps
    batches = make_batches(total, args.batch, args.len, args.vocab, pad, args.seed)
    print(f"Marian-shaped: d_model {args.d_model}, {args.layers}+{args.layers} layers, "
          f"{args.heads} heads, d_ff {args.ff}, vocab {args.vocab}; batch {args.batch} x "
          f"{args.len}; {args.precision}; {args.warmup_steps} warm-up + {args.steps} timed steps")

    def loss_of(name: str, model: torch.nn.Module, batch) -> torch.Tensor:
        src, dec_in, labels = batch
        logits = logits_of(name, model, src, dec_in, pad)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                                                 ignore_index=-100)

    seconds, losses = timed_steps(models, batches, loss_of, args.lr, args.warmup_steps, bf16)
    # real source tokens and predicted target tokens of the timed steps
    tokens = sum(int((src != pad).sum()) + int((labels != -100).sum())
                 for src, _, labels in batches[args.warmup_steps:])
    report(tokens, seconds, losses)
    if args.profile:
        profile_steps(models, batches[:args.profile], loss_of, args.lr, bf16)

if __name__ == "__main__":
    main()
