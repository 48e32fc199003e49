"""attnlab: the Transformer, BERT and GPT from readable, tested parts on PyTorch."""

from attnlab.config import PRESETS, ModelConfig
from attnlab.interop import from_pretrained, save_pretrained
from attnlab.models import BERT, GPT, Transformer, build_model
from attnlab.params import count_parameters, parameter_breakdown

__version__ = "0.1.0"

__all__ = ["ModelConfig", "PRESETS", "Transformer", "GPT", "BERT", "build_model", "from_pretrained",
           "save_pretrained", "count_parameters", "parameter_breakdown"]
