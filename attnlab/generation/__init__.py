"""attnlab.generation: inference with a trained model: decoding for decoder-only models
(``generate``) and translation for encoder–decoders (greedy, beam search, ``translate``)."""

from attnlab.generation.beam import beam_search, length_penalty
from attnlab.generation.decoder_only import (
    filter_logits,
    for_decoding,
    generate,
    penalise_repeats,
)
from attnlab.generation.translation import cross_attention, exact_match, greedy_decode, translate
from attnlab.nn.layout import decoding_layout_

__all__ = ["greedy_decode", "beam_search", "length_penalty", "generate", "filter_logits",
           "penalise_repeats", "decoding_layout_", "for_decoding", "translate", "exact_match",
           "cross_attention"]
