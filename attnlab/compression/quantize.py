"""Quantised model folders: an attnlab model folder whose ``model.safetensors`` holds integer
codes, described by ``quantization.json``.

``quantization.json``::

    {"format": "attnlab-quantized", "bits": 8 | 4 | 2, "group_size": 32, "activations":
     "float" | "dynamic", "modules": ["blocks.layers.0.self_attn.q_proj", ...]}

``modules`` names the linear layers held as codes (:mod:`attnlab.nn.quantized` gives each
one's tensors and its error bound); every other tensor is stored in bfloat16 (float32 beside
dynamic int8 activations) and run in ``nn.quantized.float_dtype()``, bfloat16 or float32 as
the CPU runs faster. Loading builds the model ``config.json`` describes on the ``meta``
device, swaps exactly the named layers for empty integer ones, gives it storage
(``build.materialize``: the float model never exists) and loads the file into that: the
same checks of shapes against the header as any folder, and nothing unpickled.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from torch import nn

from attnlab.cpu.integer import integer_kernels_
from attnlab.errors import BadInput
from attnlab.nn.quantized import BITS, quantize

SPEC_FILE = "quantization.json"
FORMAT = "attnlab-quantized"


def quantize_model(model: nn.Module, bits: int, group_size: int = 32,
                   activations: str = "float") -> dict:
    """Quantise ``model`` in place (``nn.quantized.quantize``); returns its spec, the content
    of ``quantization.json``."""
    check(bits, group_size, activations)
    modules = quantize(model, bits, group_size, activations)
    integer_kernels_(model)  # the few-row products on attnlab's CPU kernels
    return {"format": FORMAT, "bits": bits, "group_size": group_size,
            "activations": activations, "modules": modules}


def check(bits: int, group_size: int, activations: str, where: str = "") -> None:
    at = f"{where}: " if where else ""
    if bits not in BITS:
        raise BadInput(f"{at}bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or not (
            group_size >= 2 and group_size & (group_size - 1) == 0):
        raise BadInput(f"{at}group_size must be a power of two >= 2, got {group_size!r}")
    if activations not in ("float", "dynamic"):
        raise BadInput(f"{at}activations must be 'float' or 'dynamic', got {activations!r}")
    if activations == "dynamic" and bits != 8:
        raise BadInput(f"{at}dynamic activations are int8's: use bits 8, not {bits}")


def slow_here(activations: str) -> str | None:
    """Why a quantised model runs slower than float32 on this CPU, or None: the weight-only
    kernels compute in bf16, the dynamic GEMM multiplies int8 by int8. Never said silently."""
    from attnlab import hardware

    if activations == "dynamic":
        fast = hardware.cpu_int8()
        what = "dynamic int8 activations"
        cost = "the quantised model runs, but slower than float32 here"
    else:
        fast = hardware.cpu_bf16()
        what = "the integer kernels compute in bf16"
        cost = ("decoding one token at a time reads fewer bytes and runs faster, but passes "
                "over many tokens (prompts, scoring, encoders) run slower than float32 here")
    if fast.native:
        return None
    return f"{what}, and this CPU has no fast path for it ({fast.reason}): {cost}"


def warn_if_slow(spec: dict, where: str | Path) -> None:
    """Say (a warning naming ``where``) when the folder's model runs slowly on this CPU."""
    slow = slow_here(spec["activations"])
    if slow:
        warnings.warn(f"{where}: {slow}", stacklevel=3)


def spec_of(model: nn.Module) -> dict | None:
    """The spec of the integer layers a model holds (None when it holds none), so that a
    model quantised in memory (``--int4``, a QLoRA run's frozen base) is saved as a quantised
    folder; layers of different widths in one model are refused (one spec per folder)."""
    from attnlab.nn.quantized import Int4Linear, Int8Linear

    layers = {n: m for n, m in model.named_modules() if isinstance(m, (Int4Linear, Int8Linear))}
    if not layers:
        return None
    kinds = {(getattr(m, "bits", 8), getattr(m, "group_size", 32),
              getattr(m, "activations", "float")) for m in layers.values()}
    if len(kinds) > 1:
        raise BadInput(f"the model mixes integer layers of several kinds {sorted(kinds)}: "
                       "one quantization.json cannot describe them")
    (bits, group_size, activations), = kinds
    return {"format": FORMAT, "bits": bits, "group_size": group_size,
            "activations": activations, "modules": list(layers)}


def write_spec(spec: dict):
    """A writer for ``save_model_dir``'s ``extra_files``."""
    return lambda path: Path(path).write_text(json.dumps(spec, indent=1))


def read_spec(folder: Path) -> dict | None:
    """The folder's validated ``quantization.json``, or None for a float folder."""
    path = folder / SPEC_FILE
    if not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BadInput(f"{path}: not valid JSON ({e})") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise BadInput(f"{path}: not an attnlab quantization spec (format {FORMAT!r})")
    modules = spec.get("modules")
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise BadInput(f"{path}: 'modules' must be a list of layer names")
    check(spec.get("bits"), spec.get("group_size"), spec.get("activations"), str(path))
    return spec


def apply_spec(model: nn.Module, spec: dict, where: str | Path) -> nn.Module:
    """Swap the layers ``spec`` names for empty integer ones (codes are loaded next), on the
    model's device (``meta`` for a skeleton); a name the model lacks, or whose shape the
    codes cannot take, is a BadInput naming ``where``."""
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    unknown = [m for m in spec["modules"] if m not in linears]
    if unknown:
        raise BadInput(f"{where}: quantised layer {unknown[0]!r} is not a linear layer of the "
                       "model config.json describes")
    done = quantize(model, spec["bits"], spec["group_size"], spec["activations"], skip=(),
                    skeleton=True, only=set(spec["modules"]))
    if len(done) != len(spec["modules"]):
        missed = sorted(set(spec["modules"]) - set(done))
        raise BadInput(f"{where}: layer {missed[0]!r} cannot hold {spec['bits']}-bit codes in "
                       f"groups of {spec['group_size']}")
    integer_kernels_(model)
    return model


__all__ = ["FORMAT", "SPEC_FILE", "apply_spec", "check", "quantize_model", "read_spec", "spec_of",
           "slow_here", "warn_if_slow", "write_spec"]
