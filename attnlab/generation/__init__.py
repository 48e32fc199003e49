"""attnlab.generation: decoding algorithms."""

from attnlab.generation.beam import beam_search, length_penalty
from attnlab.generation.decoder_only import (
    decoding_layout_,
    filter_logits,
    generate,
    penalise_repeats,
)
from attnlab.generation.greedy import greedy_decode

__all__ = ["greedy_decode", "beam_search", "length_penalty", "generate", "filter_logits",
           "penalise_repeats", "decoding_layout_"]
