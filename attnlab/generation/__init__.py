"""attnlab.generation: inference with a trained model: decoding for decoder-only models
(``generate`` and its sampling step, :mod:`~attnlab.generation.decode`; the pipeline that
``generate``, ``chat`` and ``serve`` share, :mod:`~attnlab.generation.pipeline`) and
translation for encoder–decoders (greedy, beam search, ``translate``:
:mod:`~attnlab.generation.seq2seq`)."""

from attnlab.cpu.linear import decoding_layout_
from attnlab.cpu.prepare import for_decoding
from attnlab.generation.beam import beam_search, length_penalty
from attnlab.generation.decode import filter_logits, generate, next_tokens, penalise_repeats
from attnlab.generation.seq2seq import cross_attention, exact_match, greedy_decode, translate

__all__ = ["greedy_decode", "beam_search", "length_penalty", "generate", "filter_logits",
           "next_tokens", "penalise_repeats", "decoding_layout_", "for_decoding", "translate",
           "exact_match", "cross_attention"]
