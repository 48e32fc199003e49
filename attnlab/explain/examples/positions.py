"""The sinusoidal positional table worked by hand (the guide, the first and the network texts):

    PE(pos, 2i) = sin(pos / 10000^(2i/d)),   PE(pos, 2i+1) = cos(pos / 10000^(2i/d))

d = 4 at positions 0–2, d = 6 at position 3, d = 512 at position 5 (dimensions 0–3, 128,
510, 511) and the wavelengths 2π·10000^(2i/d) of a few dimension pairs; then "I love you"'s
embeddings plus positions. Checked against :func:`attnlab.nn.sinusoidal_table` and
:class:`attnlab.nn.SinusoidalPositionalEncoding`.
"""

from __future__ import annotations

import math

import torch

from attnlab.explain.examples.base import ExampleResult, diff, tensor
from attnlab.nn import SinusoidalPositionalEncoding, sinusoidal_table

DIMS_512 = [0, 1, 2, 3, 128, 510, 511]


def pe(pos: int, dim: int, d: int) -> float:
    """One entry of the table, by the formula: pair i = dim // 2, sine on even dims."""
    angle = pos / 10000 ** (2 * (dim // 2) / d)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


def positional_encoding(r: ExampleResult) -> None:
    small = r.step("PE, d = 4, positions 0–2", "the formula, entry by entry",
                   [[pe(p, j, 4) for j in range(4)] for p in range(3)],
                   ["pos 0", "pos 1", "pos 2"], [f"dim {j}" for j in range(4)])
    r.compare("PE, d = 4, positions 0–2 (guide)", "[[0, 1, 0, 1], [0.841, 0.540, 0.010, 1.000],"
              " [0.909, -0.416, 0.020, 0.9998]]", small)
    r.compare("PE, d = 4, positions 0–2 (network text)", "[[0.000, 1.000, 0.000, 1.000], "
              "[0.841, 0.540, 0.010, 1.000], [0.909, -0.416, 0.020, 1.000]]", small)
    six = r.step("PE(3), d = 6", "10000^(2/6) = 21.54, 10000^(4/6) = 464.16",
                 [pe(3, j, 6) for j in range(6)], cols=[f"dim {j}" for j in range(6)])
    r.compare("PE(3), d = 6", "[0.141, -0.990, 0.139, 0.990, 0.0065, 1.000]", six)

    divisor = r.step("10000^(2/512)", "the divisor of dimensions 2 and 3", 10000 ** (2 / 512))
    r.compare("10000^(2/512)", "2.15", divisor,
              why="10000^0.0039 = e^(9.21·0.0039) = 1.0366; 2.15 is 10000^(1/12)")
    top = r.step("10000^(510/512)", "the divisor of dimensions 510 and 511",
                 10000 ** (510 / 512))
    r.compare("10000^(510/512)", "9950.2", top, why="10000^(510/512) = 10000 / 1.0366 = 9646.6")
    five = r.step("PE(5), d = 512", "dimensions 0, 1, 2, 3, 128, 510, 511",
                  [pe(5, j, 512) for j in DIMS_512], cols=[f"dim {j}" for j in DIMS_512])
    r.compare("PE(5, 0..1), d = 512", "[-0.9589, 0.2837]", five[:2])
    r.compare("PE(5, 2..3), d = 512", "[0.7457, 0.6615]", five[2:4],
              why="the angle is 5/1.0366 = 4.823, not the text's 5/2.15 = 2.32; and even "
                  "sin(2.32) = 0.7311: the text's 0.7457 is sin(2.30)")
    r.compare("PE(5, 128), d = 512", "0.4794", five[4])
    r.compare("PE(5, 510), d = 512", "0.000502", five[5],
              why="5/9646.6 = 0.000518; the text's 0.000502 follows from its divisor 9950.2")
    r.compare("PE(5, 511), d = 512", "0.9999", five[6],
              why="cos(0.000518) = 0.99999987: the text cuts it to 0.9999 where rounding "
                  "gives 1.0000")
    pairs = [2, 50, 254]
    waves = r.step("wavelength / 2π, d = 512", "10000^(2i/512) for dimensions 2i, 2i + 1",
                   [10000 ** (j / 512) for j in pairs], cols=[f"dims {j},{j + 1}" for j in pairs])
    r.compare("wavelength / 2π of dims (2,3), (50,51), (254,255)", "[2.15, 1738, 10000]", waves,
              why="these are 10000^(2i/512) = 1.037, 2.458 and 96.47; the text's factors are "
                  "those of other exponents (2.15 is the divisor it also uses for PE(5, 2))")

    table = sinusoidal_table(6, 512, dtype=torch.float64)
    r.check("PE(5), d = 512 vs attnlab.nn.sinusoidal_table", diff(five, table[5, DIMS_512]),
            1e-12)
    r.check("PE, d = 4 vs sinusoidal_table", diff(small, sinusoidal_table(3, 4, torch.float64)),
            1e-12)
    r.check("PE(3), d = 6 vs sinusoidal_table", diff(six, sinusoidal_table(4, 6,
                                                                           torch.float64)[3]),
            1e-12)
    module = SinusoidalPositionalEncoding(512, max_len=6)
    embedded = module.embed(torch.zeros(1, 6, 512), torch.arange(6))
    r.check("PE(5), d = 512 vs SinusoidalPositionalEncoding.embed (float32)",
            diff(five, embedded[0, 5, DIMS_512]), 1e-6)
    _added(r, small)


def _added(r: ExampleResult, small) -> None:
    """The network text's "I love you": each embedding plus its position's row."""
    tokens = ["I", "love", "you"]
    e = r.step("E (given)", "\"I love you\", d = 4", [[0.12, -0.34, 0.56, 0.23],
                                                       [0.45, 0.67, -0.12, 0.89],
                                                       [-0.23, 0.11, 0.78, 0.45]], tokens)
    x = r.step("X = E + PE", "element-wise", e + small, tokens)
    r.compare("X = E + PE", "[[0.120, 0.660, 0.560, 1.230], [1.291, 1.210, -0.110, 1.890], "
              "[0.679, -0.306, 0.800, 1.450]]", x)
    module = SinusoidalPositionalEncoding(4, max_len=3)
    r.check("X vs SinusoidalPositionalEncoding(4).embed (float32)",
            diff(x, module.embed(tensor(e).float()[None], torch.arange(3))[0]), 1e-6)
