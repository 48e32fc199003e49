"""Images for the Vision Transformer: scikit-learn's bundled handwritten digits, their fixed
splits, random-crop augmentation, and one reader for a user's image file.

The digits (Alpaydin & Kaynak, UCI; shipped inside scikit-learn, so offline) are 1,797
grayscale 8×8 images with pixel values 0..16 and labels 0..9. Pixels are scaled to [0, 1]:

    x = pixels / 16                       (n, 1, 8, 8) float32

The splits are fixed by a seeded permutation: 20% test (only ever reported), and of the other
80%, one in ten for validation (what early stopping looks at) and the rest for training.
:class:`ImageBatches` is the training stream (seeded epochs, random crops); a split's
:meth:`ImageSet.batches` are its fixed evaluation batches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.data.stream import ImageBatch, SeededBatches
from attnlab.errors import BadInput, MissingDependency, MissingFile

DIGITS = "digits"


@dataclass
class ImageSet:
    """Images ``(n, channels, height, width)`` in [0, 1] and their labels ``(n,)``."""

    images: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, size: int) -> list[ImageBatch]:
        """The whole set in its order, ``size`` images a batch (an evaluation pass)."""
        return [ImageBatch(self.images[i : i + size], self.labels[i : i + size])
                for i in range(0, len(self), size)]


@dataclass
class ImageSplits:
    train: ImageSet
    val: ImageSet
    test: ImageSet
    classes: list[str]


def load_digits(seed: int = 0, test_fraction: float = 0.2,
                val_fraction: float = 0.1) -> ImageSplits:
    """scikit-learn's 8×8 digits, split test / validation / train by a permutation seeded with
    ``seed`` (the same seed, the same splits on every machine)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise MissingDependency("--data digits needs scikit-learn, which ships the digits: "
                                "pip install 'attnlab[vision]'") from None
    bunch = sklearn_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = round(test_fraction * len(order))
    test, rest = order[:n_test], order[n_test:]
    n_val = round(val_fraction * len(rest))
    val, train = rest[:n_val], rest[n_val:]

    def part(index: Tensor) -> ImageSet:
        return ImageSet(images[index], labels[index])

    return ImageSplits(part(train), part(val), part(test), [str(d) for d in range(10)])


def random_crop(images: Tensor, pad: int, generator: torch.Generator | None = None) -> Tensor:
    """Each image shifted by up to ``pad`` pixels each way: zero-pad by ``pad``, then cut a
    window of the original size at a random offset. ``(n, c, h, w)`` -> ``(n, c, h, w)``."""
    if pad == 0:
        return images
    n, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n, 1, 1), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n, 1, 1), generator=generator)
    rows = (dy + torch.arange(h).view(1, h, 1)).expand(n, h, w)  # (n, h, w) source row
    cols = (dx + torch.arange(w).view(1, 1, w)).expand(n, h, w)
    batch = torch.arange(n).view(n, 1, 1).expand(n, h, w)
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)


class ImageBatches(SeededBatches):
    """Endless training batches of ``batch_size`` images, each shifted by :func:`random_crop`
    (``pad`` pixels at most). Epoch e is a permutation seeded by ``(seed, e)`` cut into
    ``len(data) // batch_size`` batches (the few images left over differ from epoch to epoch),
    and batch n's crops are seeded by ``(seed, n)``: batch n is known from n alone, so a
    resumed run sees the same batches."""

    def __init__(self, data: ImageSet, batch_size: int, seed: int = 0, pad: int = 0):
        if batch_size < 1 or pad < 0:
            raise BadInput(f"the batch size must be >= 1 and the crop padding >= 0, got "
                           f"batch size {batch_size}, padding {pad}")
        self.data, self.batch_size, self.seed, self.pad = data, batch_size, seed, pad
        self.per_epoch = max(1, len(data) // batch_size)

    def batch(self, n: int) -> ImageBatch:
        """The global batch number ``n``, this rank's rows of it."""
        epoch, k = divmod(n, self.per_epoch)
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(
            2 * (self.seed * 1_000_003 + epoch)))
        chosen = order[k * self.batch_size : (k + 1) * self.batch_size]
        crops = torch.Generator().manual_seed(2 * (self.seed * 1_000_003 + n) + 1)
        images = random_crop(self.data.images[chosen], self.pad, crops)  # the global batch
        return ImageBatch(images[self.rank :: self.world],
                          self.data.labels[chosen][self.rank :: self.world])


def read_image(spec: str | os.PathLike, channels: int, size: int) -> tuple[Tensor, str]:
    """One image ``(1, channels, size, size)`` in [0, 1] and a name for it.

    ``spec`` is ``digits:N`` (image N of the digits test split), a ``.npy`` array (read
    without pickle) of shape ``(size, size)`` or ``(channels, size, size)`` with values in
    [0, 1], or a PNG/JPEG picture of exactly ``size``×``size`` pixels.
    """
    text = str(spec)
    if text.startswith(f"{DIGITS}:"):
        test = load_digits().test
        index = text.partition(":")[2]
        if not index.isdigit() or int(index) >= len(test):
            raise BadInput(f"--image {text}: expected digits:N with 0 <= N < {len(test)}")
        i = int(index)
        return test.images[i : i + 1], f"digits test image {i} (label {int(test.labels[i])})"
    path = Path(text)
    if not path.is_file():
        raise MissingFile(f"image not found: {path}")
    if path.suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise BadInput(f"{path}: not a readable .npy array ({e})") from None
        image = torch.tensor(array, dtype=torch.float32)
    else:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as picture:
                if picture.size[0] * picture.size[1] > 4096 * 4096:
                    raise BadInput(f"{path}: {picture.size[0]}x{picture.size[1]} pixels is "
                                   "too large")
                picture = picture.convert("L" if channels == 1 else "RGB")
                image = torch.tensor(np.asarray(picture), dtype=torch.float32) / 255.0
        except (UnidentifiedImageError, OSError) as e:
            raise BadInput(f"{path}: not a readable image ({e})") from None
        if image.dim() == 3:  # (h, w, c) -> (c, h, w)
            image = image.permute(2, 0, 1)
    given = tuple(image.shape)
    if image.dim() == 2 and channels == 1:
        image = image.unsqueeze(0)
    if tuple(image.shape) != (channels, size, size):
        raise BadInput(f"{path}: image of shape {given}, but the model reads "
                       f"({channels}, {size}, {size}) (channels, height, width)")
    return image.unsqueeze(0), str(path)
