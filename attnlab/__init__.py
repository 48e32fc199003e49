"""attnlab: the Transformer, BERT and GPT from readable, tested parts on PyTorch."""

from attnlab import hardware

# Before any bf16 matrix product: a CPU that lists AMX in a system that does not enable it
# would die with SIGILL (see attnlab.hardware).
hardware.guard_amx()

from attnlab.build import build_model, count_parameters, parameter_breakdown  # noqa: E402
from attnlab.config import PRESETS, ModelConfig  # noqa: E402
from attnlab.interop import from_pretrained, save_pretrained  # noqa: E402
from attnlab.models import BERT, GPT, Transformer  # noqa: E402
from attnlab.storage import Loaded, load  # noqa: E402
from attnlab.version import __version__  # noqa: E402, F401

__all__ = ["ModelConfig", "PRESETS", "Transformer", "GPT", "BERT", "build_model", "load", "Loaded",
           "from_pretrained", "save_pretrained", "count_parameters", "parameter_breakdown"]
