"""lm-evaluation-harness on an attnlab choice file: the reference side of benchmarks/fewshot.py.

Runs in a Python environment that has ``lm_eval`` (installed for the benchmark only, never a
dependency of attnlab), for example::

    python3 -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install torch==2.13.0 lm_eval
    /tmp/lmeval/bin/python benchmarks/lm_eval_choice.py --model HF_FOLDER --data F.jsonl \
        --pool POOL.jsonl --shots 5 --batch 4

It writes a local multiple-choice task for the JSONL file (``context``, ``choices``,
``answer``, optional ``instruction``): ``doc_to_text`` the context, the target delimiter
``" "``, the few-shot delimiter ``"\\n\\n"``, the instruction followed by a blank line as the
description, and the first K lines of ``--pool`` as the demonstrations, in file order
(lm-eval's ``first_n`` sampler). The model is loaded before the clock starts; the time of
``simple_evaluate`` alone is reported. One JSON object is printed on the last line: acc,
acc_norm, each example's log-likelihoods, and the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# the example's instruction and a blank line, when it has one (Jinja, rendered per example)
DESCRIPTION = ("{% if instruction is defined and instruction %}{{instruction}}\\n\\n"
               "{% endif %}")
TASK = """task: attnlab_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
    pool: {pool}
output_type: multiple_choice
test_split: test
fewshot_split: pool
fewshot_config:
  sampler: first_n
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
description: "{description}"
target_delimiter: " "
fewshot_delimiter: "\\n\\n"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a Hugging Face model folder")
    p.add_argument("--data", required=True)
    p.add_argument("--pool", help="demonstrations, taken in file order (default: --data)")
    p.add_argument("--shots", type=int, default=0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()

    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp())
    data, pool = Path(args.data).resolve(), Path(args.pool or args.data).resolve()
    task = TASK.format(data=data, pool=pool, description=DESCRIPTION)
    (folder / "attnlab_choice.yaml").write_text(task)
    lm = HFLM(pretrained=args.model, dtype=args.dtype, batch_size=args.batch, device="cpu")
    manager = TaskManager(include_path=str(folder))
    start = time.perf_counter()
    out = simple_evaluate(model=lm, tasks=["attnlab_choice"], num_fewshot=args.shots,
                          task_manager=manager, log_samples=True, random_seed=0,
                          numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    seconds = time.perf_counter() - start
    metrics = out["results"]["attnlab_choice"]
    samples = sorted(out["samples"]["attnlab_choice"], key=lambda s: s["doc_id"])
    loglik = [[float(r[0]) for r in s["filtered_resps"]] for s in samples]
    prompts = [s["arguments"][0][0] if isinstance(s["arguments"][0], (list, tuple))
               else s["arguments"]["gen_args_0"]["arg_0"] for s in samples]
    print(json.dumps({"acc": metrics["acc,none"], "acc_norm": metrics["acc_norm,none"],
                      "loglikelihoods": loglik, "first_prompt": prompts[0] if prompts else "",
                      "seconds": seconds, "batch": args.batch,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
