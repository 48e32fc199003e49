"""CoNLL-2003 NER: attnlab vs transformers' BertForTokenClassification, fine-tuned side by
side from all-MiniLM-L6-v2 (uncased) on the same batches (benchmarks/side_by_side.py).

Both start from the same weights: attnlab's model (``train ner``'s: the encoder from MiniLM,
a new ``tokens`` head at N(0, 0.02)) is saved as a transformers folder and loaded back by
transformers. Batches are attnlab's training rows (each word labelled at its first subword,
-100 elsewhere; :mod:`attnlab.tasks.ner`), drawn by the same seeded stream ``train ner`` uses.
After training, both tag the test file word by word through the same code
(``predict_tags``) and are scored at the entity level (seqeval's default mode; checked equal
to seqeval in tests/tasks/test_ner.py). ``--lora R`` trains LoRA adapters (and the head) on
both sides instead (peft on transformers' side).

    .venv/bin/python benchmarks/conll.py [--minutes 30] [--epochs 3] [--lr 1e-4]
        [--lora R [--lora-targets q,v,...]]
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from attnlab import load, save_pretrained
from attnlab.data.labelled import LabelledBatches
from attnlab.tasks.ner import encode_sentences, entity_scores, predict_tags, read_conll, tag_set
from attnlab.tasks.pretrained import from_encoder
from attnlab.training.objectives import Tag

sys.path.insert(0, str(Path(__file__).parent))
from side_by_side import arguments, describe, train_pair  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003"


class HFTagger(torch.nn.Module):
    """transformers' model behind attnlab's ``model(ids, types, mask) -> logits``."""

    def __init__(self, hf, config):
        super().__init__()
        self.hf, self.config = hf, config

    def forward(self, ids, token_type_ids=None, attention_mask=None):
        return self.hf(input_ids=ids, token_type_ids=token_type_ids,
                       attention_mask=attention_mask).logits


def models(tags: list[str], lora: int | None, targets: list[str] | None):
    base = load("minilm")
    config = dataclasses.replace(base.config, head="tokens", num_labels=len(tags),
                                 extra={**base.config.extra, "labels": tags})
    torch.manual_seed(0)
    ours = from_encoder(config, base.model, "minilm")
    folder = tempfile.mkdtemp(prefix="conll-bench-")
    save_pretrained(ours, folder)
    hf = transformers.BertForTokenClassification.from_pretrained(folder)
    theirs = HFTagger(hf, config)
    if lora:
        from peft import LoraConfig, get_peft_model

        from attnlab.interop.peft import adapt, adapter_spec, module_names

        spec = adapter_spec(ours, r=lora, alpha=2 * lora, targets=targets)
        # the same layers by their transformers names (exact paths: "output.dense" alone
        # would also name attention's output)
        names = module_names(config)
        adapt(ours, spec)
        theirs.hf = get_peft_model(hf, LoraConfig(
            r=lora, lora_alpha=2 * lora, target_modules=[names[m] for m in spec["modules"]],
            modules_to_save=["classifier"]))
    return base.tokenizer, ours, theirs


def main() -> None:
    p = arguments(__doc__, str(DATA), epochs=3.0, batch=32, max_len=128)
    p.add_argument("--lora", type=int, metavar="R", help="LoRA of rank R on both sides")
    p.add_argument("--lora-targets", help="layers for LoRA, as train's --lora-targets "
                   "(default: q,v)")
    p.add_argument("--only-attnlab", action="store_true", help="no transformers run")
    args = p.parse_args()
    print(describe())
    parts = {s: read_conll(Path(args.data) / f"{s}.txt") for s in ("train", "test")}
    tags = tag_set(parts["train"])
    targets = args.lora_targets.split(",") if args.lora_targets else None
    tok, ours, theirs = models(tags, args.lora, targets)
    rows = encode_sentences(parts["train"], tok, tags, args.max_len)
    per_epoch = len(rows) // args.batch
    steps = int(args.epochs * per_epoch)
    trained = sum(p.numel() for p in ours.parameters() if p.requires_grad)
    print(f"{len(rows):,} training rows, batch {args.batch}, {per_epoch} steps an epoch; "
          f"schedule {steps} steps (lr {args.lr}, 10% warmup); attnlab trains at most "
          f"{args.minutes:g} min; {trained:,} parameters train", flush=True)
    task = Tag()
    runs = {"attnlab": (ours, lambda m, b: task.loss(m, b).loss / task.target_tokens(b))}
    if not args.only_attnlab:
        runs["transformers"] = (theirs, lambda m, b: torch.nn.functional.cross_entropy(
            m(b.ids, b.token_type_ids, b.attention_mask).flatten(0, 1), b.labels.flatten(),
            ignore_index=-100))
    stream = iter(LabelledBatches(rows, args.batch, tok.pad_id, seed=0))
    done = train_pair(runs, stream, steps, args.lr, steps // 10, args.minutes * 60)
    print(f"trained {done['steps']} steps ({done['steps'] / per_epoch:.2f} epochs)")
    gold = [list(s.tags) for s in parts["test"]]
    words = [list(s.words) for s in parts["test"]]
    print("| | test entity F1 | precision | recall | training s | steps/s |")
    print("|---|---|---|---|---|---|")
    for name, (model, _) in runs.items():
        with torch.inference_mode():
            s = entity_scores(gold, predict_tags(model, tok, words, max_len=args.max_len))
        secs = done["seconds"][name]
        print(f"| {name} | {100 * s.f1:.2f} | {100 * s.precision:.2f} | {100 * s.recall:.2f} "
              f"| {secs:.0f} | {done['steps'] / secs:.3f} |", flush=True)
    if "transformers" in done["seconds"]:
        print(f"speed ratio (attnlab / transformers): "
              f"{done['seconds']['transformers'] / done['seconds']['attnlab']:.2f}x")


if __name__ == "__main__":
    main()
