"""What every command family shares: the options for a model, a preset, the device and the
precision, reading texts, and decoding's options (training's are in
:mod:`attnlab.cli.training_options`).

What ``auto`` means for ``--device`` and ``--precision`` is decided in :mod:`attnlab.hardware`;
this module only turns the flags (and the deprecated ``--bf16`` / ``--fp32`` aliases) into a
device and a precision, and says what was chosen. Precision means autocast over fp32 weights
for training and for the encoder and translation commands, and weights cast to that dtype for
``generate`` (decoding reads every weight once a token, so half the bytes is what makes it
faster).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.errors import BadInput

if TYPE_CHECKING:  # the CLI imports torch only when a command needs it
    import torch

    from attnlab.config import ModelConfig
    from attnlab.storage import Loaded


class UsageError(BadInput):
    """A problem with the command line itself: reported in one line, exit code 2."""


# --- options ---------------------------------------------------------------------------------
def add_model_arg(p: argparse.ArgumentParser, what: str, required: bool = True,
                  default: str | None = None, adapter: bool = True) -> None:
    """``--model``: anything :func:`attnlab.load` resolves; ``what`` says which kinds fit.
    ``--adapter DIR`` (unless ``adapter`` is False): a peft-format adapter to add onto it."""
    p.add_argument("--model", required=required, default=default, help=what)
    if adapter:
        p.add_argument("--adapter", metavar="DIR",
                       help="a LoRA adapter in peft's format (adapter_config.json + "
                            "adapter_model.safetensors: RUN/adapter from 'train --lora', or "
                            "one peft made) to add onto --model")


def add_out_arg(p: argparse.ArgumentParser, what: str, default: str | None = None,
                required: bool = False) -> None:
    """``--out``: where a command writes its result (a run folder, a file)."""
    p.add_argument("--out", default=default, required=required, help=what)


def add_preset_args(p: argparse.ArgumentParser, default: str, any_arch: bool = False) -> None:
    """``--preset NAME`` and repeatable ``--set KEY=VALUE`` overrides of its fields. The help
    lists the presets of the default's architecture (``any_arch``: every preset)."""
    from attnlab.config import PRESETS

    def arch(name: str) -> str:
        return PRESETS[name].get("arch", "encoder-decoder")

    names = [n for n in PRESETS if any_arch or arch(n) == arch(default)]
    p.add_argument("--preset", default=default, metavar="NAME",
                   help=f"model preset: {', '.join(names)}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. --set positional=rope "
                        "('attnlab info --preset NAME' shows the fields)")


def add_quiet_arg(p: argparse.ArgumentParser) -> None:
    """``--quiet``: no line saying what the command runs (:func:`announce`)."""
    p.add_argument("--quiet", action="store_true",
                   help="do not print the line saying what the command runs: the model, "
                        "device, precision and threads")


def add_runtime_args(p: argparse.ArgumentParser, legacy: str | None = None) -> None:
    """``--device`` and ``--precision`` (attnlab.hardware decides what ``auto`` means);
    ``legacy`` keeps ``--bf16`` or ``--fp32`` as a deprecated alias for one release."""
    p.add_argument("--device", default="auto",
                   help="auto (CUDA, then MPS, then CPU), cpu, cuda[:N] or mps")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"],
                   help="auto: bf16 where the hardware runs it natively and faster than fp32, "
                        "fp16 with loss scaling on a CUDA GPU without bf16, else fp32 (default: "
                        "$ATTNLAB_PRECISION, else auto; 'attnlab info --hardware' shows it). "
                        "Autocast over fp32 weights, except generate, which casts the weights")
    add_quiet_arg(p)
    if legacy:
        p.add_argument(legacy, dest="legacy_precision", action="store_const",
                       const=legacy.removeprefix("--"),
                       help=f"deprecated alias of --precision {legacy.removeprefix('--')}")


# --- turning options into objects ------------------------------------------------------------
def overrides(args: argparse.Namespace) -> dict[str, object]:
    """``--set KEY=VALUE`` pairs; a value is JSON when it parses, else a bare string."""
    out = {}
    for text in args.set:
        if "=" not in text:
            raise UsageError(f"--set {text!r}: expected KEY=VALUE")
        key, value = text.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a bare string such as positional=rope
    return out


def preset_config(args: argparse.Namespace, arch: str | None = None,
                  suggestion: str = "") -> ModelConfig:
    """``--preset`` with its ``--set`` overrides; with ``arch``, it must be of that
    architecture (``suggestion`` names presets that are)."""
    from attnlab.config import ModelConfig
    from attnlab.storage import KIND_NAMES

    config = ModelConfig.from_preset(args.preset, **overrides(args))
    if arch is not None and config.arch != arch:
        raise UsageError(f"--preset {args.preset} is not {KIND_NAMES[arch]} model "
                         f"(arch={config.arch!r}); try {suggestion}")
    return config


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
    if say is not None and not getattr(args, "quiet", False):
        auto = hardware.precision_name(asked) == "auto"
        why = f" (auto: {hardware.auto_precision(device)[1]})" if auto else ""
        import torch

        say(f"device {device}, precision {precision}{why}, {torch.get_num_threads()} threads")
    return device, precision


def announce(args: argparse.Namespace, model: str | Path, device: torch.device | str,
             precision: str) -> None:
    """The one line a command prints (on stderr, so that its output can be piped) before it
    runs a model: the folder or file it loaded (a run's checkpoint, not the run), the device,
    the precision and the threads. ``--quiet`` hides it."""
    if getattr(args, "quiet", False):
        return
    import torch

    print(f"attnlab {args.command}: running {model} on {device}, {precision}, "
          f"{torch.get_num_threads()} threads", file=sys.stderr)


def load_for(args: argparse.Namespace, kind: str) -> tuple[Loaded, torch.device, str]:
    """``(loaded, device, precision)``: the ``--model`` of ``kind`` (one line naming the
    folder otherwise), on ``--device``, and the precision to run it in. A quantised folder's
    float parts (embeddings, norms, attention, a float output layer) take that precision
    (``auto``: bf16 where the CPU runs it natively); its integer layers keep their codes."""
    from attnlab.hardware import DTYPES
    from attnlab.nn.quantized import integer_parts
    from attnlab.storage import load

    device, precision = runtime(args)
    loaded = load(args.model, adapter=args.adapter).expect(kind, args.command)
    loaded.model.to(device)
    if integer_parts(loaded.model) is not None:
        loaded.model.to(DTYPES[precision])  # (floating tensors only: the codes stay integers)
    return loaded, device, precision


def texts(args: argparse.Namespace, skip_blank: bool = False, required: bool = True) -> list[str]:
    """The positional texts, else standard input one line each (``skip_blank``: blank lines
    left out); with ``required``, none at all is an error."""
    if args.text:
        return list(args.text)
    try:
        found = [line.rstrip("\n") for line in sys.stdin if line.strip() or not skip_blank]
    except UnicodeDecodeError as e:
        raise UsageError(f"standard input is not UTF-8 text (byte {e.start}: {e.reason})") from None
    if required and not found:
        raise UsageError("no input text (give it as arguments or on stdin)")
    return found


def warn_unknown(tokenizer, texts: list[str], what: str) -> None:
    """One warning naming the symbols of ``texts`` that ``tokenizer`` reads as ``<unk>``."""
    if not hasattr(tokenizer, "unknown"):  # byte-level BPE knows every byte
        return
    missing = list(dict.fromkeys(p for t in texts for p in tokenizer.unknown(t)))
    if missing:
        shown = " ".join(repr(p) for p in missing[:10]) + (" ..." if len(missing) > 10 else "")
        warnings.warn(f"{what}: {len(missing)} symbol(s) not in the model's vocabulary, read as "
                      f"<unk>: {shown}", stacklevel=2)


# --- decoding (generate, chat) ---------------------------------------------------------------
def add_decoding_args(p: argparse.ArgumentParser, max_new_tokens: int, compile: bool = False,
                      length_help: str = "tokens to generate; past the model's trained "
                      "context, each step sees the last context tokens (as nanoGPT crops)"
                      ) -> None:
    """The options of a command that decodes with
    :func:`attnlab.generation.decode.generate`: length, sampling, seed and ``--int4``."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=length_help)
    add_sampling_args(p)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    add_integer_args(p)
    add_kv_cache_arg(p)
    add_compile_arg(p, compile)


def add_sampling_args(p: argparse.ArgumentParser, temperature: float | None = 0.0) -> None:
    """``--temperature``, ``--top-k``, ``--top-p`` and ``--seed``: the sampling step,
    :func:`attnlab.generation.decode.next_tokens` (``temperature`` None: translate's, which
    tells a flag given from one left out, :func:`translation_beam`)."""
    p.add_argument("--temperature", type=float, default=temperature,
                   help="0: greedy; above 0: sample from softmax(logits / T)")
    p.add_argument("--top-k", type=int, help="sample among the K most likely tokens")
    p.add_argument("--top-p", type=float,
                   help="sample among the fewest tokens whose probability reaches P")
    p.add_argument("--seed", type=int,
                   help="random seed of sampling (default: a fresh one, printed on stderr; "
                        "greedy decoding needs none)")


SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "seed")


def translation_beam(args: argparse.Namespace, default: int) -> int:
    """The beam size of ``translate`` and ``evaluate translate``: ``--beam``, else 1 when a
    sampling flag (``--temperature``, ``--top-k``, ``--top-p``, ``--seed``) is given, else
    ``default``; ``--beam K`` > 1 with a sampling flag is refused. Checks the sampling flags as
    ``generate`` does and sets ``args.temperature`` (0: not sampling)."""
    given = [f"--{name.replace('_', '-')}" for name in SAMPLING_FLAGS
             if getattr(args, name) is not None]
    beam = args.beam if args.beam is not None else 1 if given else default
    if beam < 1:
        raise UsageError(f"--beam must be >= 1, got {beam}")
    if beam > 1 and given:
        raise UsageError(f"--beam {beam} searches for the best translation and {given[0]} "
                         "samples one: drop one of them")
    args.temperature = args.temperature or 0.0
    if given:  # (greedy translation never imports the sampling step)
        from attnlab.generation.decode import check_sampling

        try:
            check_sampling(args.temperature, args.top_k, args.top_p)
        except ValueError as e:
            raise _flag_error(e) from None
    return beam


def add_kv_cache_arg(p: argparse.ArgumentParser) -> None:
    """``--kv-cache``: the KV cache's storage dtype (``for_decoding``'s ``kv_cache``)."""
    p.add_argument("--kv-cache", choices=["fp32", "bf16", "fp16"],
                   help="store the KV cache in this dtype, for decoding on attnlab's CPU "
                        "kernels (default: the activations', float32 there); bf16 or fp16 "
                        "(range ±65504) halve the bytes long contexts read at every token, "
                        "and --compile may then part from eager decoding's greedy text")


def add_integer_args(p: argparse.ArgumentParser) -> None:
    """``--int4`` / ``--int8``: integer weight matrices on attnlab's CPU kernels
    (attnlab/cpu/), PyTorch's where those cannot be built."""
    p.add_argument("--int4", action="store_true",
                   help="4-bit weights (a GGUF keeps its own Q4_1 codes), an int8 output layer")
    p.add_argument("--int8", action="store_true",
                   help="8-bit weights, one scale per output channel (a GGUF's Q8_0 blocks are "
                        "re-quantised per channel), an int8 output layer")


def integer_bits(args: argparse.Namespace) -> int | None:
    """4 or 8 with ``--int4``/``--int8`` (commands without them: None)."""
    int4, int8 = getattr(args, "int4", False), getattr(args, "int8", False)
    if int4 and int8:
        raise UsageError("--int4 or --int8, not both")
    return 4 if int4 else 8 if int8 else None


def add_compile_arg(p: argparse.ArgumentParser, default: bool = False) -> None:
    """``--compile`` / ``--no-compile``: the compiled one-token step of a decoding command."""
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=default,
                   help="decode each token after the first with a compiled one-token step "
                        "(torch.compile, a static KV cache): faster per token, after a "
                        "compile of tens of seconds on a CPU (less once inductor's cache on "
                        "disk is warm)")


def compiled_step(args: argparse.Namespace, encoder_decoder: bool = False):
    """The compiled one-token step that ``--compile`` asks for (of an encoder–decoder with
    ``encoder_decoder``), or None: nothing is compiled, nothing imported."""
    if not args.compile:
        return None
    from attnlab.generation.compiled import new_step

    return new_step(encoder_decoder)


def decoding_options(args: argparse.Namespace, rows: int = 1):
    """The :class:`~attnlab.generation.pipeline.DecodingOptions` of a decoding command's flags
    (those of :func:`add_decoding_args`; ``serve`` has no sampling flags: each request brings
    its own). ``--int4``/``--int8`` with a ``--precision`` other than bf16 is refused."""
    from attnlab.generation.pipeline import DecodingOptions

    bits = integer_bits(args)
    if bits and args.precision not in (None, "auto", "bf16"):
        raise UsageError(f"--int{bits} sets its own precision (integer weights, float32 "
                         f"activations); drop --precision {args.precision}")
    sampling = {k: getattr(args, k) for k in ("max_new_tokens", "temperature", "top_k", "top_p",
                                                "repetition_penalty", "beam", "alpha", "penalty")
                if hasattr(args, k)}
    return DecodingOptions(device=args.device, precision=args.precision, bits=bits,
                           kv_cache=getattr(args, "kv_cache", None),
                           compile=getattr(args, "compile", False), rows=rows, **sampling)


def decoding_runtime(args: argparse.Namespace) -> tuple[torch.device, str, str]:
    """``(device, precision, what announce says)`` of a decoding command
    (:func:`attnlab.generation.pipeline.decoding_runtime`): integer weights run on the CPU."""
    from attnlab.generation.pipeline import decoding_runtime as pick

    found = pick(decoding_options(args))
    if integer_bits(args) and args.device == "auto":
        args.device = "cpu"
    return found.device, found.precision, found.label


def integer_label(bits: int) -> str:
    """What ``announce`` says of an integer model
    (:func:`attnlab.generation.pipeline.integer_label`)."""
    from attnlab.generation.pipeline import integer_label as label

    return label(bits)


def check_decoding_args(args: argparse.Namespace, decoding, ids) -> None:
    """The decoding pipeline's check of ``ids`` and the sampling settings, its error naming the
    flag rather than the keyword argument (``decoding``: a
    :class:`~attnlab.generation.pipeline.Decoding`, or None to check the options alone)."""
    from attnlab.generation.decode import check_decoding

    try:
        if decoding is not None:
            decoding.check(ids)
        else:
            check_decoding(ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                           args.repetition_penalty)
    except ValueError as e:
        raise _flag_error(e) from None


def _flag_error(e: ValueError) -> UsageError:
    """A decoding check's error (it starts with the keyword's name) naming the flag."""
    name, rest = str(e).split(" ", 1)
    return UsageError(f"--{name.replace('_', '-')} {rest}")


def sampling_seed(args: argparse.Namespace) -> int:
    """``--seed``; when sampling without one, a fresh seed, printed (even with --quiet) so the
    run can be repeated. Greedy decoding: 0 (unused)."""
    seed = args.seed
    if seed is None and args.temperature > 0:
        import secrets

        seed = secrets.randbits(31)
        print(f"attnlab {args.command}: sampling with --seed {seed}", file=sys.stderr)
    return seed or 0
