"""attnlab.generation: decoding algorithms."""

from attnlab.generation.greedy import greedy_decode

__all__ = ["greedy_decode"]
