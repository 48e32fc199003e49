"""SQuAD v1.1: attnlab vs transformers' BertForQuestionAnswering, fine-tuned side by side
from all-MiniLM-L6-v2 on the same batches (benchmarks/side_by_side.py).

The development set's articles 0-37 train and 38-47 evaluate (../shared/data/squad/README:
the training set is not available here). Both start from the same weights (attnlab's ``qa``
model saved as a transformers folder and loaded back) and see attnlab's windows
(:mod:`attnlab.tasks.qa`, checked equal to transformers' overflowing windows in
tests/tasks/test_qa.py) in the same order. After training, both answer every held-out
question through the same code (``answer_many``: the best span over all windows, at most 30
tokens) and are scored with SQuAD's exact match and F1.

    .venv/bin/python benchmarks/squad.py [--minutes 30] [--epochs 2] [--max-len 384]
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from attnlab import load, save_pretrained
from attnlab.tasks.pretrained import from_encoder
from attnlab.tasks.qa.data import SpanBatches, read_squad, training_rows
from attnlab.tasks.qa.predict import answer_many, squad_scores
from attnlab.training.objectives import Span

sys.path.insert(0, str(Path(__file__).parent))
from side_by_side import arguments, describe, train_pair  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "dev-v1.1.json.gz"


class HFSpans(torch.nn.Module):
    """transformers' model behind attnlab's ``model(ids, types, mask) -> (start, end)``."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, ids, token_type_ids=None, attention_mask=None):
        out = self.hf(input_ids=ids, token_type_ids=token_type_ids,
                      attention_mask=attention_mask)
        return out.start_logits, out.end_logits


def main() -> None:
    p = arguments(__doc__, str(DATA), epochs=2.0, batch=16, max_len=384)
    p.add_argument("--stride", type=int, default=128)
    args = p.parse_args()
    print(describe())
    train, held_out = read_squad(args.data, range(0, 38)), read_squad(args.data, range(38, 48))
    base = load("minilm")
    config = dataclasses.replace(base.config, head="qa", num_labels=2)
    torch.manual_seed(0)
    ours = from_encoder(config, base.model, "minilm")
    folder = tempfile.mkdtemp(prefix="squad-bench-")
    save_pretrained(ours, folder)
    theirs = HFSpans(transformers.BertForQuestionAnswering.from_pretrained(folder))
    tok = base.tokenizer
    rows = training_rows(train, tok, args.max_len, args.stride)
    per_epoch = len(rows) // args.batch
    steps = int(args.epochs * per_epoch)
    print(f"{len(train):,} training questions ({len(rows):,} windows of {args.max_len}, "
          f"stride {args.stride}), {len(held_out):,} held-out questions; batch {args.batch}, "
          f"{per_epoch} steps an epoch; schedule {steps} steps (lr {args.lr}, 10% warmup); "
          f"attnlab trains at most {args.minutes:g} min", flush=True)
    task = Span()
    runs = {"attnlab": (ours, lambda m, b: task.loss(m, b).loss / task.target_tokens(b)),
            "transformers": (theirs, lambda m, b: m.hf(
                input_ids=b.ids, token_type_ids=b.token_type_ids,
                attention_mask=b.attention_mask, start_positions=b.labels[:, 0],
                end_positions=b.labels[:, 1]).loss)}
    stream = iter(SpanBatches(rows, args.batch, tok.pad_id, seed=0))
    done = train_pair(runs, stream, steps, args.lr, steps // 10, args.minutes * 60, 25)
    print(f"trained {done['steps']} steps ({done['steps'] / per_epoch:.2f} epochs)")
    print("| | exact match | F1 | training s | steps/s |")
    print("|---|---|---|---|---|")
    pairs = [(q.question, q.context) for q in held_out]
    refs = [list(q.answers) for q in held_out]
    for name, (model, _) in runs.items():
        with torch.inference_mode():
            found = answer_many(model, tok, pairs, args.max_len, args.stride)
        em, f1 = squad_scores([a for a, *_ in found], refs)
        secs = done["seconds"][name]
        print(f"| {name} | {em:.2f} | {f1:.2f} | {secs:.0f} | {done['steps'] / secs:.3f} |",
              flush=True)
    print(f"speed ratio (attnlab / transformers): "
          f"{done['seconds']['transformers'] / done['seconds']['attnlab']:.2f}x")


if __name__ == "__main__":
    main()
