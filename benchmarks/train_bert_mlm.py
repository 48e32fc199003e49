"""Training tokens/s of masked-LM pre-training: attnlab's BERT (mlm head) vs transformers'
BertForMaskedLM, side by side.

A BERT-shaped model (post-LN, learned positions, GELU, the MLM head's decoder tied to the word
embedding) is built by transformers from a config and converted into attnlab through
``attnlab.from_pretrained`` on the folder its ``save_pretrained`` wrote, so both start from the
same weights. Both train on the same random token batches in the same order: full-length
sequences (``[CLS] ... [SEP]``, no padding) with 15% of the other positions chosen as targets
and their inputs replaced by ``[MASK]`` (the same positions on both sides), the same
cross-entropy (labels -100 off the targets), the same AdamW (side_by_side.optimizer, weight
decay on matrices) and clipping 1.0. Dropout is 0 so the two runs stay equal step for step.
``--logits`` says where each side computes the vocabulary logits: ``everywhere`` (the default:
both at every position, the same work); ``targets`` (both only at the targets: attnlab's
``masked_positions``, transformers' ``cls`` head on the gathered hidden states); ``as-trained``
(each as its library trains masked-LM: ``attnlab train mlm`` at the targets,
``BertForMaskedLM(labels=...)`` at every position). The two models alternate step by
step in one process (who goes first alternates too); warm-up steps are not timed. Tokens
counted: every input token (batch x len a step).

    .venv/bin/python benchmarks/train_bert_mlm.py [--precision fp32|bf16] [--steps 20]
        [--batch 32] [--len 128] [--threads 2] [--logits everywhere|targets|as-trained]
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

PAD, CLS, SEP, MASK = 0, 2, 3, 4  # ids 0-4 are special; random tokens are drawn from 5 up


def make_batches(n: int, batch: int, length: int, vocab: int,
                 seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, labels)``: random ids with 15% of the non-special positions replaced by
    [MASK] in ``inputs`` and kept in ``labels`` (-100 elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(MASK + 1, vocab, (batch, length), generator=g)
        ids[:, 0], ids[:, -1] = CLS, SEP
        chosen = torch.rand(batch, length, generator=g) < 0.15
        chosen[:, 0] = chosen[:, -1] = False
        chosen[:, 1] = True  # at least one target a row
        out.append((ids.masked_fill(chosen, MASK), ids.masked_fill(~chosen, -100)))
    return out


def logits_of(name: str, model: torch.nn.Module, ids: torch.Tensor,
              targets: torch.Tensor | None) -> torch.Tensor:
    """``(batch, len, vocab)``, or ``(n_targets, vocab)`` where ``targets`` is given."""
    if name == "attnlab":
        return model(ids, masked_positions=targets)
    if targets is None:
        return model(input_ids=ids).logits
    return model.cls(model.bert(input_ids=ids).last_hidden_state[targets])


def main() -> None:
    p = training_arguments(__doc__, steps=20, batch=32, length=128, layers=4)
    p.add_argument("--logits", choices=["everywhere", "targets", "as-trained"],
                   default="everywhere", help="where each side computes vocabulary logits")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe())
    bf16 = args.precision == "bf16"
    torch.manual_seed(args.seed)
    hf_cfg = transformers.BertConfig(
        vocab_size=args.vocab, hidden_size=args.d_model, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, intermediate_size=args.ff, max_position_embeddings=512,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=PAD)
    theirs = transformers.BertForMaskedLM(hf_cfg)
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards"
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = from_pretrained(folder)
    models = {"attnlab": ours, "transformers": theirs}
    total = args.warmup_steps + args.steps
    batches = make_batches(total, args.batch, args.len, args.vocab, args.seed)
    print(f"BERT-shaped: d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"d_ff {args.ff}, vocab {args.vocab}; batch {args.batch} x {args.len}; "
          f"{args.precision}; logits: {args.logits}"
          f"; {args.warmup_steps} warm-up + {args.steps} timed steps")

    def loss_of(name: str, model: torch.nn.Module, batch) -> torch.Tensor:
        ids, labels = batch
        at_targets = args.logits == "targets" or (args.logits == "as-trained"
                                                  and name == "attnlab")
        targets = labels != -100 if at_targets else None
        wanted = labels[targets] if at_targets else labels.flatten()
        logits = logits_of(name, model, ids, targets)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, -2), wanted,
                                                 ignore_index=-100)

    seconds, losses = timed_steps(models, batches, loss_of, args.lr, args.warmup_steps, bf16)
    report(args.steps * args.batch * args.len, seconds, losses)
    if args.profile:
        profile_steps(models, batches[:args.profile], loss_of, args.lr, bf16)

if __name__ == "__main__":
    main()
