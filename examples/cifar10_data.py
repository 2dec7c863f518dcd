"""CIFAR-10 for examples/train_cifar10.py: the real data when it is there, generated data otherwise.

Both go through torchvision's own ``CIFAR10`` loader (``download=False``: nothing is fetched).

* Real data: ``<data-dir>/cifar-10-batches-py`` as unpacked from ``cifar-10-python.tar.gz``.
  torchvision checks the files' MD5 sums, as it always does.
* Generated data: when ``--data-dir`` holds no CIFAR-10, a learnable stand-in is written in the
  very same format (``data_batch_1..5``, ``test_batch``, ``batches.meta``: pickled dicts with
  ``b"data"`` uint8 N x 3072 rows in CHW order, ``b"labels"``, ``b"batch_label"``,
  ``b"filenames"``; ``b"label_names"`` in the meta file) and read by the same loader. Only the MD5
  check is left out, since the files are not the real ones. Each class is a smooth colour
  pattern (a few random sinusoids per channel); each image is its class pattern at a random
  shift and contrast, with another class's pattern blended in, a colour cast and pixel noise.
  The files depend only on the seed and the sizes, and are generated once per folder: written
  to a temporary folder and renamed into place, so concurrent jobs never see half a dataset.
"""

import os
import pickle
import shutil
import struct

import numpy as np
from torchvision import transforms
from torchvision.datasets import CIFAR10

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
BATCHES_FOLDER = CIFAR10.base_folder  # "cifar-10-batches-py"
TRAIN_FILES = 5
# Generated files carry this key in batches.meta (torchvision ignores unknown keys), so a folder of
# generated data is never mistaken for the real CIFAR-10.
GENERATED_MARKER = b"generated_by"
GENERATOR_NAME = b"torch_ddp_lite examples/cifar10_data.py (not the real CIFAR-10)"

# Difficulty of the generated data: tuned so that a small ResNet learns it over a few epochs
# without reaching 100 % at once.
PATTERN_WAVES = 4          # sinusoids per class and channel
MAX_SHIFT = 8              # pixels; patterns are drawn on a (32 + MAX_SHIFT)^2 canvas
DISTRACTOR_WEIGHT = 0.9    # the largest weight of another class's pattern blended in
NOISE_STD = 1.5            # pixel noise, in units of the patterns' standard deviation
PIXEL_SCALE = 36.0         # pattern units -> uint8 steps around mid-grey


class GeneratedCIFAR10(CIFAR10):
    """torchvision's CIFAR10 loader for generated files: identical except that the MD5 sums of
    the real files are not checked (file presence still is)."""

    train_list = [[name, None] for name, _ in CIFAR10.train_list]
    test_list = [[name, None] for name, _ in CIFAR10.test_list]
    meta = {**CIFAR10.meta, "md5": None}


def is_generated(root):
    """True when ``root/cifar-10-batches-py`` was written by this module."""
    with open(os.path.join(root, BATCHES_FOLDER, "batches.meta"), "rb") as meta_file:
        return GENERATED_MARKER in pickle.load(meta_file, encoding="bytes")


def has_cifar10(root):
    folder = os.path.join(root, BATCHES_FOLDER)
    names = [name for name, _ in CIFAR10.train_list + CIFAR10.test_list] + ["batches.meta"]
    return all(os.path.isfile(os.path.join(folder, name)) for name in names)


def generated_root(cache_dir, seed, train_size, test_size):
    """Where the generated data set for these parameters lives (one folder per parameter set)."""
    return os.path.join(os.path.expanduser(cache_dir), f"seed{seed}-train{train_size}-test{test_size}")


def ensure_generated(cache_dir, seed, train_size, test_size):
    """Generates the data set unless it is there already; returns its root. Safe to call from
    several processes at once: each writes its own temporary folder, the first rename wins."""
    root = generated_root(cache_dir, seed, train_size, test_size)
    if has_cifar10(root):
        return root
    temporary = f"{root}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    write_generated(os.path.join(temporary, BATCHES_FOLDER), seed, train_size, test_size)
    try:
        os.rename(temporary, root)
    except OSError:  # another process renamed its copy first; both are identical
        shutil.rmtree(temporary, ignore_errors=True)
    return root


def write_generated(folder, seed, train_size, test_size):
    if train_size < TRAIN_FILES or test_size < 1:
        raise ValueError(f"generated data needs at least {TRAIN_FILES} training and 1 test image")
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    canvases = class_patterns(rng)
    train_sizes = [train_size // TRAIN_FILES] * (TRAIN_FILES - 1)
    train_sizes.append(train_size - sum(train_sizes))
    batches = [(f"data_batch_{i + 1}", f"training batch {i + 1} of {TRAIN_FILES}", n)
               for i, n in enumerate(train_sizes)]
    batches.append(("test_batch", "testing batch 1 of 1", test_size))
    for file_name, batch_label, count in batches:
        images, labels = draw_images(rng, canvases, count)
        write_pickle(os.path.join(folder, file_name), {
            b"batch_label": batch_label.encode(),
            b"labels": labels.tolist(),
            b"data": images.reshape(count, 3 * 32 * 32),
            b"filenames": [f"generated_{file_name}_{i:05d}.png".encode() for i in range(count)],
        })
    write_pickle(os.path.join(folder, "batches.meta"), {
        b"num_cases_per_batch": train_sizes[0],
        b"label_names": [name.encode() for name in LABEL_NAMES],
        b"num_vis": 3 * 32 * 32,
        GENERATED_MARKER: GENERATOR_NAME,
    })


class Python2Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table is extensible
    """Protocol 2, with ``bytes`` written as Python 2 ``str`` objects, as in the real files (made by
    Python 2): ``pickle.load(f, encoding="latin1")`` (torchvision's call) gives ``str`` keys and
    ``encoding="bytes"`` gives ``b"data"``, ``b"labels"``...; numpy arrays load either way."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_python2_str(self, value):
        if len(value) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(value)]) + value)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(value)) + value)
        self.memoize(value)

    dispatch[bytes] = save_python2_str


def write_pickle(path, value):
    with open(path, "wb") as out:
        Python2Pickler(out, protocol=2).dump(value)


def class_patterns(rng):
    """(10, 3, C, C) float32 canvases, C = 32 + MAX_SHIFT: per class and channel, a sum of a few
    low-frequency sinusoids with random direction, frequency and phase, scaled to unit std."""
    size = 32 + MAX_SHIFT
    y, x = np.mgrid[0:size, 0:size] / 32.0
    shape = (10, 3, PATTERN_WAVES, 1, 1)
    frequency_x = rng.uniform(-3.0, 3.0, shape)
    frequency_y = rng.uniform(-3.0, 3.0, shape)
    phase = rng.uniform(0.0, 2 * np.pi, shape)
    amplitude = rng.uniform(0.5, 1.0, shape)
    waves = amplitude * np.sin(2 * np.pi * (frequency_x * x + frequency_y * y) + phase)
    canvases = waves.sum(axis=2)
    canvases /= canvases.std(axis=(2, 3), keepdims=True)
    return canvases.astype(np.float32)


def draw_images(rng, canvases, count):
    """(count, 3, 32, 32) uint8 images and their labels, balanced classes in random order."""
    labels = rng.permutation(np.arange(count) % 10)
    distractors = (labels + rng.integers(1, 10, count)) % 10
    contrast = rng.uniform(0.6, 1.4, (count, 1, 1, 1)).astype(np.float32)
    distractor_weight = rng.uniform(0.0, DISTRACTOR_WEIGHT, (count, 1, 1, 1)).astype(np.float32)
    colour_cast = rng.normal(0.0, 0.3, (count, 3, 1, 1)).astype(np.float32)
    images = contrast * random_crops(rng, canvases, labels)
    images += distractor_weight * random_crops(rng, canvases, distractors)
    images += colour_cast
    images += NOISE_STD * rng.standard_normal((count, 3, 32, 32), dtype=np.float32)
    pixels = np.clip(np.rint(127.5 + PIXEL_SCALE * images), 0, 255).astype(np.uint8)
    return pixels, labels


def random_crops(rng, canvases, labels):
    """A 32x32 window at a random offset of each label's canvas."""
    count = len(labels)
    rows = rng.integers(0, MAX_SHIFT + 1, count)[:, None] + np.arange(32)
    cols = rng.integers(0, MAX_SHIFT + 1, count)[:, None] + np.arange(32)
    return canvases[labels[:, None, None, None], np.arange(3)[None, :, None, None],
                    rows[:, None, :, None], cols[:, None, None, :]]


def train_transform():
    """The standard CIFAR-10 augmentation: random crop with 4-pixel padding, horizontal flip."""
    return transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD),
    ])


def test_transform():
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


def load_datasets(root):
    """(train, test) datasets from ``root/cifar-10-batches-py``, real or generated."""
    loader = GeneratedCIFAR10 if is_generated(root) else CIFAR10
    return (loader(root, train=True, transform=train_transform(), download=False),
            loader(root, train=False, transform=test_transform(), download=False))
