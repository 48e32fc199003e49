"""``--device`` and ``--precision`` for every command that trains or runs a model.

What ``auto`` means is decided in :mod:`attnlab.hardware`; this module only turns the flags
(and the deprecated ``--bf16`` / ``--fp32`` aliases) into a device and a precision, and says
what was chosen. Precision means autocast over fp32 weights for training and for the encoder
and translation commands, and weights cast to that dtype for ``generate`` (decoding reads every
weight once a token, so half the bytes is what makes it faster).
"""

from __future__ import annotations

import argparse
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports torch only when a command needs it
    import torch


class UsageError(Exception):
    """A problem with the user's input: reported in one line, exit code 2."""


def add_runtime_args(p: argparse.ArgumentParser, legacy: str | None = None) -> None:
    """``--device`` and ``--precision`` (attnlab.hardware decides what ``auto`` means);
    ``legacy`` keeps ``--bf16`` or ``--fp32`` as a deprecated alias for one release."""
    p.add_argument("--device", default="auto",
                   help="auto (CUDA, then MPS, then CPU), cpu, cuda[:N] or mps (default: auto)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"],
                   help="auto: bf16 where the hardware runs it natively and faster than fp32, "
                        "fp16 with loss scaling on a CUDA GPU without bf16, else fp32 (default: "
                        "$ATTNLAB_PRECISION, else auto; 'attnlab info --hardware' shows it). "
                        "Autocast over fp32 weights, except generate, which casts the weights")
    if legacy:
        p.add_argument(legacy, dest="legacy_precision", action="store_const",
                       const=legacy.removeprefix("--"),
                       help=f"deprecated alias of --precision {legacy.removeprefix('--')}")


def runtime(args: argparse.Namespace, say=None) -> tuple[torch.device, str]:
    """``(device, precision)`` from ``--device``/``--precision`` (and the deprecated alias);
    ``say`` (e.g. print) gets a line naming the choice and, for auto, why."""
    from attnlab import hardware

    asked = args.precision
    legacy = getattr(args, "legacy_precision", None)
    if legacy:
        warnings.warn(f"--{legacy} is deprecated and goes in the next release; use "
                      f"--precision {legacy}", FutureWarning, stacklevel=2)
        if asked not in (None, legacy):
            raise UsageError(f"--{legacy} contradicts --precision {asked}")
        asked = legacy
    device = hardware.pick_device(args.device)
    precision = hardware.pick_precision(asked, device)
    if say is not None:
        auto = hardware.precision_name(asked) == "auto"
        why = f" (auto: {hardware.auto_precision(device)[1]})" if auto else ""
        say(f"device {device}, precision {precision}{why}")
    return device, precision
