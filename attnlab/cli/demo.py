"""``attnlab demo``: the main job (``make demo``), English number words into German."""

from __future__ import annotations

import argparse

from attnlab.cli.common import UsageError, add_out_arg, add_runtime_args, runtime


def cmd_demo(args: argparse.Namespace) -> None:
    from attnlab.demo import run_demo

    device, precision = runtime(args, say=print)
    result = run_demo(args.out, steps=args.steps, time_budget=args.time_budget, n_test=args.n_test,
                      n_train=args.n_train, precision=precision, device=str(device))
    if args.min_accuracy is not None and result["accuracy"] < args.min_accuracy:
        raise UsageError(f"held-out exact match {result['accuracy']:.1%} is below "
                         f"--min-accuracy {args.min_accuracy:.1%}")


def add_commands(sub) -> None:
    demo = sub.add_parser("demo", help="the main job: numbers EN->DE in a few minutes",
                          description="Train a small translator on English->German number "
                                      "words and report held-out exact match.")
    add_out_arg(demo, "the run folder", "runs/demo")
    demo.add_argument("--steps", type=int, default=1500,
                      help="training steps (the learning rate decays to zero at the last)")
    demo.add_argument("--time-budget", type=float,
                      help="train as many steps as fit in this many seconds, timed over the "
                           "first steps: the learning rate decays to zero at the last of them")
    demo.add_argument("--n-train", type=int, default=200_000)
    demo.add_argument("--n-test", type=int, default=500)
    add_runtime_args(demo, legacy="--fp32")
    demo.add_argument("--min-accuracy", type=float, help="fail (exit 2) below this")
    demo.set_defaults(func=cmd_demo)
