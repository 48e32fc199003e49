"""Images for the ViT: the digits' fixed splits, random crops, the training stream and its
evaluation batches, and reading one image file."""

from collections import Counter

import numpy as np
import pytest
import torch

from attnlab.data.images import (
    ImageBatches,
    ImageSet,
    load_digits,
    random_crop,
    read_image,
)
from attnlab.errors import BadInput, MissingFile

N_DIGITS = 1797


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def rows(images: torch.Tensor) -> Counter:
    """The images (and so their splits) as a multiset of their bytes: the digits hold a few
    identical images, so a partition is checked by counts, not by set overlap."""
    return Counter(bytes(x.numpy().tobytes()) for x in images)


def test_digits_splits_partition_the_images_20_test_then_10_percent_validation(digits):
    from sklearn.datasets import load_digits as sklearn_digits

    n_test = round(0.2 * N_DIGITS)
    n_val = round(0.1 * (N_DIGITS - n_test))
    assert (len(digits.test), len(digits.val), len(digits.train)) == (
        n_test, n_val, N_DIGITS - n_test - n_val) == (359, 144, 1294)
    everything = torch.tensor(sklearn_digits().images, dtype=torch.float32).unsqueeze(1) / 16
    assert (rows(digits.train.images) + rows(digits.val.images) + rows(digits.test.images)
            == rows(everything))
    for part in (digits.train, digits.val, digits.test):
        assert part.images.shape[1:] == (1, 8, 8) and part.images.dtype == torch.float32
        assert 0 <= part.images.min() and part.images.max() <= 1
        assert part.labels.dtype == torch.long and len(part.labels) == len(part.images)
    assert digits.classes == [str(d) for d in range(10)]
    assert set(digits.train.labels.tolist()) == set(range(10))


def test_digits_splits_are_fixed_by_the_seed(digits):
    again, other = load_digits(0), load_digits(1)
    for name in ("train", "val", "test"):
        assert torch.equal(getattr(again, name).images, getattr(digits, name).images)
        assert torch.equal(getattr(again, name).labels, getattr(digits, name).labels)
    assert not torch.equal(other.test.labels, digits.test.labels)


def reference_crop(padded: torch.Tensor, dy: int, dx: int, h: int, w: int) -> torch.Tensor:
    return padded[:, dy : dy + h, dx : dx + w]


@pytest.mark.parametrize("shape, pad", [((200, 1, 8, 8), 1), ((100, 3, 5, 7), 2)])
def test_random_crop_is_a_shifted_window_of_the_zero_padded_image(shape, pad):
    """Each output image is the original-size window of the zero-padded image at some offset
    within ±pad (the reference: slicing), and every offset is used."""
    images = torch.rand(shape)
    n, _, h, w = shape
    out = random_crop(images, pad, torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
    offsets = [(dy, dx) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)]
    used = set()
    for i in range(n):
        found = [o for o in offsets if torch.equal(out[i], reference_crop(padded[i], *o, h, w))]
        assert len(found) == 1, f"image {i}: matches offsets {found}"
        used.add(found[0])
    assert used == set(offsets)


def test_random_crop_is_seeded_and_pad_0_changes_nothing():
    images = torch.rand(16, 1, 8, 8)
    one = random_crop(images, 1, torch.Generator().manual_seed(3))
    assert torch.equal(one, random_crop(images, 1, torch.Generator().manual_seed(3)))
    assert not torch.equal(one, random_crop(images, 1, torch.Generator().manual_seed(4)))
    assert torch.equal(random_crop(images, 0), images)


def small_set(n: int = 10) -> ImageSet:
    """n images whose pixels all equal their index (so a crop keeps telling them apart)."""
    images = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 4, 4) + 1
    return ImageSet(images.contiguous(), torch.arange(n))


def test_image_batches_shuffle_each_epoch_and_are_known_from_their_number():
    data = small_set(10)
    stream = ImageBatches(data, batch_size=3, seed=5, pad=1)
    assert stream.per_epoch == 3  # 10 // 3: one image left over, a different one each epoch
    epochs = [torch.cat([stream.batch(e * 3 + k).labels for k in range(3)]) for e in range(4)]
    for labels in epochs:
        assert len(set(labels.tolist())) == 9  # no image twice in an epoch
    assert len({tuple(t.tolist()) for t in epochs}) == 4  # a new order each epoch
    for n in (0, 7):
        b = stream.batch(n)
        # the crop moves pixels, never mixes images: what is left of an image is its own
        for image, label in zip(b.images, b.labels, strict=True):
            assert set(image.unique().tolist()) <= {0.0, float(label) + 1}
        again = ImageBatches(data, batch_size=3, seed=5, pad=1).batch(n)
        assert torch.equal(again.images, b.images) and torch.equal(again.labels, b.labels)
    assert not torch.equal(ImageBatches(data, 3, seed=6).batch(0).labels,
                           ImageBatches(data, 3, seed=5).batch(0).labels)


def test_image_batches_resume_and_shard():
    data = small_set(12)
    stream = ImageBatches(data, batch_size=4, seed=0, pad=1)
    it = iter(stream)
    seen = [next(it) for _ in range(5)]
    resumed = ImageBatches(data, batch_size=4, seed=0, pad=1)
    resumed.load_state_dict(stream.state_dict())
    assert torch.equal(next(iter(resumed)).images, next(it).images)
    ranks = [ImageBatches(data, 4, seed=0, pad=1).shard(r, 2).batch(4) for r in range(2)]
    whole = seen[4]
    assert torch.equal(ranks[0].images, whole.images[0::2])
    assert torch.equal(ranks[1].labels, whole.labels[1::2])


def test_image_batches_refuse_bad_sizes():
    with pytest.raises(BadInput, match="batch size"):
        ImageBatches(small_set(), batch_size=0)
    with pytest.raises(BadInput, match="padding"):
        ImageBatches(small_set(), batch_size=2, pad=-1)


def test_evaluation_batches_cover_the_set_in_order(digits):
    batches = digits.val.batches(64)
    assert [len(b.labels) for b in batches] == [64, 64, 16]
    assert torch.equal(torch.cat([b.images for b in batches]), digits.val.images)
    assert torch.equal(torch.cat([b.labels for b in batches]), digits.val.labels)


# --- read_image ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(8, 8), (1, 8, 8)])
def test_read_image_npy_of_the_right_shape(tmp_path, shape):
    array = np.random.default_rng(0).random(shape).astype(np.float32)
    np.save(tmp_path / "x.npy", array)
    image, name = read_image(tmp_path / "x.npy", channels=1, size=8)
    assert image.shape == (1, 1, 8, 8) and name == str(tmp_path / "x.npy")
    assert torch.equal(image.view(8, 8), torch.tensor(array).view(8, 8))


@pytest.mark.parametrize("shape", [(7, 7), (3, 8, 8), (1, 1, 8, 8)])
def test_read_image_npy_of_the_wrong_shape_names_both(tmp_path, shape):
    np.save(tmp_path / "x.npy", np.zeros(shape, dtype=np.float32))
    with pytest.raises(BadInput) as e:
        read_image(tmp_path / "x.npy", channels=1, size=8)
    assert str(tuple(shape)) in str(e.value) and "(1, 8, 8)" in str(e.value)
    assert "\n" not in str(e.value)


def test_read_image_refuses_a_pickled_npy(tmp_path):
    np.save(tmp_path / "x.npy", np.array([{"not": "pixels"}], dtype=object), allow_pickle=True)
    with pytest.raises(BadInput, match="x.npy"):
        read_image(tmp_path / "x.npy", channels=1, size=8)


def test_read_image_digits_test_images(digits):
    image, name = read_image("digits:3", channels=1, size=8)
    assert torch.equal(image[0], digits.test.images[3])
    assert name == f"digits test image 3 (label {int(digits.test.labels[3])})"


@pytest.mark.parametrize("spec", ["digits:359", "digits:-1", "digits:x", "digits:"])
def test_read_image_digits_index_out_of_range(spec):
    with pytest.raises(BadInput, match="0 <= N < 359"):
        read_image(spec, channels=1, size=8)


def test_read_image_png_and_a_missing_file(tmp_path):
    from PIL import Image

    pixels = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4
    Image.fromarray(pixels, mode="L").save(tmp_path / "x.png")
    image, _ = read_image(tmp_path / "x.png", channels=1, size=8)
    assert torch.allclose(image.view(8, 8), torch.tensor(pixels, dtype=torch.float32) / 255)
    with pytest.raises(MissingFile, match="nothing.png"):
        read_image(tmp_path / "nothing.png", channels=1, size=8)
