"""attnlab: the Transformer, BERT and GPT from readable, tested parts on PyTorch."""

from attnlab.config import PRESETS, ModelConfig
from attnlab.models import Transformer
from attnlab.params import count_parameters, parameter_breakdown

__version__ = "0.1.0"

__all__ = ["ModelConfig", "PRESETS", "Transformer", "count_parameters", "parameter_breakdown"]
