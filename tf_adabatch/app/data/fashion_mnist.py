"""Fashion-MNIST through TensorFlow Datasets, prepared offline from Debian's IDX files.

Debian's package ``dataset-fashion-mnist`` installs the four original gzip IDX files in
``/usr/share/datasets/fashion-mnist``. TFDS's own ``fashion_mnist`` builder cannot use them:
it downloads the files itself and verifies their checksums, and Debian's copies differ in
their gzip headers. `AdabatchFashionMnist` is a small TFDS builder that reads those files
from its manual directory instead, so preparing the dataset needs no network at all.

`load` is the entry point: it prepares the dataset once (TFDS reuses the prepared files on
later calls) and returns ``(image, label)`` pairs, falling back to TFDS's standard
``fashion_mnist`` (which downloads) when the IDX files are not installed.

The IDX parser works on its own, for instance on a tiny in-memory file:

>>> import gzip, struct
>>> raw = struct.pack(">iiii", 2051, 1, 3, 2) + bytes([0, 1, 2, 3, 4, 255])
>>> parse_idx(gzip.compress(raw))
array([[[  0,   1],
        [  2,   3],
        [  4, 255]]], dtype=uint8)
"""

from __future__ import annotations

import gzip
import os
import socket
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

__all__ = [
    "CLASS_NAMES",
    "DEFAULT_MANUAL_DIR",
    "IDX_FILES",
    "MANUAL_DIR_ENV",
    "AdabatchFashionMnist",
    "load",
    "parse_idx",
]

#: Where Debian's ``dataset-fashion-mnist`` installs the IDX files.
DEFAULT_MANUAL_DIR = "/usr/share/datasets/fashion-mnist"
#: Environment variable naming another folder with the four IDX files.
MANUAL_DIR_ENV = "TF_ADABATCH_FASHION_MNIST_DIR"
#: The four files, by split: (images, labels).
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
#: The ten classes, in label order.
CLASS_NAMES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_IMAGES_MAGIC = 2051  # unsigned bytes, 3 dimensions (count, rows, columns)
_LABELS_MAGIC = 2049  # unsigned bytes, 1 dimension (count)
_NDIM = {_IMAGES_MAGIC: 3, _LABELS_MAGIC: 1}
_IMAGE_SIZE = 28

_NOT_FOUND = (
    "Fashion-MNIST not found: install Debian's `dataset-fashion-mnist` "
    "(apt-get install dataset-fashion-mnist), set TF_ADABATCH_FASHION_MNIST_DIR to a folder "
    "with the four IDX .gz files, or allow TFDS to download `fashion_mnist`."
)

_DESCRIPTION = """\
Fashion-MNIST is a dataset of Zalando's article images: a training set of 60,000 examples
and a test set of 10,000 examples. Each example is a 28x28 grayscale image, associated with
a label from 10 classes. This builder reads the original gzip IDX files from a local folder
(by default Debian's `dataset-fashion-mnist`, /usr/share/datasets/fashion-mnist) and keeps
the files' example order. Released under the MIT licence.
"""

_CITATION = """\
@article{xiao2017fashionmnist,
  author        = {Han Xiao and Kashif Rasul and Roland Vollgraf},
  title         = {Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning
                   Algorithms},
  journal       = {CoRR},
  volume        = {abs/1708.07747},
  year          = {2017},
  url           = {http://arxiv.org/abs/1708.07747},
  archivePrefix = {arXiv},
  eprint        = {1708.07747},
}
"""

_MANUAL_INSTRUCTIONS = f"""\
Put the four Fashion-MNIST IDX files ({", ".join(f for pair in IDX_FILES.values() for f in pair)})
in the manual directory, e.g. `apt-get install dataset-fashion-mnist` installs them in
{DEFAULT_MANUAL_DIR}.
"""


def parse_idx(
    path_or_bytes: str | os.PathLike[str] | bytes, *, expected_magic: int | None = None
) -> np.ndarray:
    """Reads an IDX file of unsigned bytes (MNIST's format) into a ``uint8`` array.

    Args:
      path_or_bytes: a path to the file, or its content; gzip-compressed or not (gzip is
        detected from the content, not the name).
      expected_magic: 2051 (images: count, rows, columns) or 2049 (labels: count) to accept
        only that kind of file; ``None`` accepts both.

    Returns:
      The array, of shape ``(count, rows, columns)`` for images or ``(count,)`` for labels.

    Raises:
      ValueError: if the magic number is not the expected one (or neither 2051 nor 2049), or
        if the data does not hold exactly the number of items the header announces.

    Images and labels, from in-memory files:

    >>> import gzip, struct
    >>> labels = struct.pack(">ii", 2049, 3) + bytes([9, 0, 7])
    >>> parse_idx(gzip.compress(labels))
    array([9, 0, 7], dtype=uint8)
    >>> images = struct.pack(">iiii", 2051, 2, 1, 1) + bytes([10, 20])
    >>> parse_idx(images, expected_magic=2051).shape
    (2, 1, 1)

    Wrong files are rejected with a clear message:

    >>> parse_idx(labels, expected_magic=2051)
    Traceback (most recent call last):
    ValueError: <bytes>: IDX magic number 2049 (labels), expected 2051 (images).
    >>> parse_idx(labels[:-1])
    Traceback (most recent call last):
    ValueError: <bytes>: the IDX header announces 3 items (3 bytes), the file holds 2 bytes.

    The Debian files themselves:

    >>> parse_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")[:5]
    array([9, 2, 1, 1, 6], dtype=uint8)
    """
    if isinstance(path_or_bytes, bytes | bytearray | memoryview):
        source, data = "<bytes>", bytes(path_or_bytes)
    else:
        source = os.fspath(path_or_bytes)
        with tf.io.gfile.GFile(source, "rb") as f:
            data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    kinds = {_IMAGES_MAGIC: "images", _LABELS_MAGIC: "labels"}
    if len(data) < 4:
        raise ValueError(f"{source}: too short for an IDX file ({len(data)} bytes).")
    magic = int(np.frombuffer(data, ">u4", count=1)[0])
    if magic not in _NDIM:
        raise ValueError(
            f"{source}: IDX magic number {magic}, expected 2051 (images) or 2049 (labels); "
            "not an MNIST-style IDX file of unsigned bytes."
        )
    if expected_magic is not None and magic != expected_magic:
        raise ValueError(
            f"{source}: IDX magic number {magic} ({kinds[magic]}), "
            f"expected {expected_magic} ({kinds.get(expected_magic, 'unknown')})."
        )
    ndim = _NDIM[magic]
    header = 4 * (1 + ndim)
    if len(data) < header:
        raise ValueError(f"{source}: truncated IDX header ({len(data)} bytes).")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    expected = int(np.prod(shape))
    found = len(data) - header
    if found != expected:
        raise ValueError(
            f"{source}: the IDX header announces {shape[0]} items ({expected} bytes), "
            f"the file holds {found} bytes."
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def _registered(name: str) -> bool:
    """Whether TFDS already has a builder called `name` (e.g. this module imported twice)."""
    registry = getattr(tfds.core.registered, "_DATASET_REGISTRY", {})
    return name in registry


# TFDS registers every builder class under its name and raises on a second class of the same
# name (e.g. this file imported again under another module name); the first one stays.
class AdabatchFashionMnist(  # type: ignore[call-arg]  # TFDS's __init_subclass__ keyword
    tfds.core.GeneratorBasedBuilder,
    skip_registration=_registered("adabatch_fashion_mnist"),
):
    """TFDS builder ``adabatch_fashion_mnist``: Fashion-MNIST from local gzip IDX files.

    Same features, splits and supervised keys as TFDS's ``fashion_mnist``, but the data come
    from the ``manual_dir`` of the download config (no network access, no checksums) and the
    examples keep the order of the IDX files (``disable_shuffling``).

    >>> import os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> builder = AdabatchFashionMnist(data_dir=tmp.name)
    >>> builder.info.features["label"].names[:3]
    ['T-shirt/top', 'Trouser', 'Pullover']
    >>> builder.info.supervised_keys
    ('image', 'label')
    >>> builder.data_dir == os.path.join(tmp.name, "adabatch_fashion_mnist", "1.0.0")
    True

    Preparing it (once; see `load`, which does this for you) takes 15 s or so on two cores:
    ``builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
    manual_dir="/usr/share/datasets/fashion-mnist"))``.

    >>> tmp.cleanup()
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release, from the Debian IDX files."}  # noqa: RUF012
    MANUAL_DOWNLOAD_INSTRUCTIONS = _MANUAL_INSTRUCTIONS

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=_DESCRIPTION,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(_IMAGE_SIZE, _IMAGE_SIZE, 1)),
                    "label": tfds.features.ClassLabel(names=list(CLASS_NAMES)),
                }
            ),
            supervised_keys=("image", "label"),
            disable_shuffling=True,
            homepage="https://github.com/zalandoresearch/fashion-mnist",
            citation=_CITATION,
            license="MIT",
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
        manual_dir = dl_manager.manual_dir
        return {
            split: self._generate_examples(manual_dir / images, manual_dir / labels)
            for split, (images, labels) in IDX_FILES.items()
        }

    def _generate_examples(
        self, images_path: os.PathLike[str], labels_path: os.PathLike[str]
    ) -> Iterator[tuple[int, dict]]:
        images = parse_idx(images_path, expected_magic=_IMAGES_MAGIC)
        labels = parse_idx(labels_path, expected_magic=_LABELS_MAGIC)
        if images.shape[1:] != (_IMAGE_SIZE, _IMAGE_SIZE):
            raise ValueError(
                f"{os.fspath(images_path)}: images of {images.shape[1]}x{images.shape[2]} "
                f"pixels, expected {_IMAGE_SIZE}x{_IMAGE_SIZE}."
            )
        if len(images) != len(labels):
            raise ValueError(
                f"{os.fspath(images_path)} holds {len(images)} images but "
                f"{os.fspath(labels_path)} holds {len(labels)} labels."
            )
        if labels.size and labels.max() >= len(CLASS_NAMES):
            raise ValueError(f"{os.fspath(labels_path)}: label {labels.max()} out of range 0..9.")
        for index, (image, label) in enumerate(zip(images, labels, strict=True)):
            yield index, {"image": image[:, :, None], "label": int(label)}


def _default_data_dir() -> str:
    """TFDS's default: ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets`` (read at call time)."""
    return os.environ.get("TFDS_DATA_DIR") or os.path.join(
        os.path.expanduser("~"), "tensorflow_datasets"
    )


def _default_manual_dir() -> str:
    """``$TF_ADABATCH_FASHION_MNIST_DIR``, else Debian's folder."""
    return os.environ.get(MANUAL_DIR_ENV) or DEFAULT_MANUAL_DIR


def _has_idx_files(manual_dir: str) -> bool:
    return all(
        os.path.isfile(os.path.join(manual_dir, name))
        for pair in IDX_FILES.values()
        for name in pair
    )


def _check_download_host(url: str) -> None:
    """Fails at once (OSError) when `url`'s host does not resolve and no proxy is set.

    Offline, TFDS's downloader retries with back-off for about three and a half minutes before
    giving up; a failed DNS look-up says the same thing in milliseconds.
    """
    host = urllib.parse.urlsplit(url).hostname
    if not host or urllib.request.getproxies():
        return  # nothing to check, or the proxy resolves names, not us
    try:
        socket.getaddrinfo(host, None)
    except OSError as exc:
        raise OSError(f"cannot reach {host} to download fashion_mnist: {exc}") from exc


def _load_tfds_standard(split: str, data_dir: str) -> tf.data.Dataset:
    """The fallback: TFDS's own ``fashion_mnist``, downloaded (or reused) in `data_dir`."""
    builder = tfds.builder("fashion_mnist", data_dir=data_dir)
    if not builder.data_path.exists():
        _check_download_host(getattr(builder, "URL", ""))
    builder.download_and_prepare()
    return builder.as_dataset(split=split, as_supervised=True)


def load(
    split: str, *, data_dir: str | None = None, manual_dir: str | None = None
) -> tf.data.Dataset:
    """Fashion-MNIST as a dataset of ``(image, label)`` pairs, prepared once and then reused.

    Sources, in order:

    1. `AdabatchFashionMnist`, prepared in `data_dir` from the IDX files in `manual_dir`
       (default: ``$TF_ADABATCH_FASHION_MNIST_DIR``, else Debian's
       ``/usr/share/datasets/fashion-mnist``), or already prepared there earlier;
    2. else TFDS's standard ``fashion_mnist``, which downloads the files;
    3. else a `RuntimeError` that says what to install.

    Args:
      split: a TFDS split: ``"train"`` (60,000 examples), ``"test"`` (10,000), or a slice
        such as ``"train[:10%]"``.
      data_dir: where TFDS keeps prepared datasets; default ``$TFDS_DATA_DIR``, else
        ``~/tensorflow_datasets``. The prepared files of this builder go to
        ``<data_dir>/adabatch_fashion_mnist/1.0.0``.
      manual_dir: the folder with the four gzip IDX files.

    Returns:
      ``(image, label)`` pairs: ``uint8`` images of shape ``[28, 28, 1]`` and ``int64``
      labels in 0..9, in the order of the IDX files (source 1) or TFDS's order (source 2),
      not shuffled, not batched.

    Raises:
      RuntimeError: if neither the IDX files nor TFDS's download are available.

    With a tiny stand-in for the IDX files, to keep the example fast (the real files take
    15 s or so to prepare, once):

    >>> import gzip, os, struct, tempfile
    >>> manual, data = tempfile.TemporaryDirectory(), tempfile.TemporaryDirectory()
    >>> for split, (images, labels) in IDX_FILES.items():
    ...     with open(os.path.join(manual.name, images), "wb") as f:
    ...         _ = f.write(gzip.compress(struct.pack(">iiii", 2051, 2, 28, 28) + bytes(1568)))
    ...     with open(os.path.join(manual.name, labels), "wb") as f:
    ...         _ = f.write(gzip.compress(struct.pack(">ii", 2049, 2) + bytes([3, 7])))
    >>> ds = load("train", data_dir=data.name, manual_dir=manual.name)  # doctest: +ELLIPSIS
    Downloading and preparing dataset ... to .../adabatch_fashion_mnist/1.0.0...
    Dataset adabatch_fashion_mnist downloaded and prepared to ... Subsequent calls will reuse this data.
    >>> ds.element_spec
    (TensorSpec(shape=(28, 28, 1), dtype=tf.uint8, name=None),
     TensorSpec(shape=(), dtype=tf.int64, name=None))
    >>> [int(label) for _, label in ds]
    [3, 7]
    >>> ds = load("train", data_dir=data.name, manual_dir=manual.name)  # reused: no output
    >>> manual.cleanup(); data.cleanup()
    """
    data_dir = data_dir or _default_data_dir()
    manual_dir = manual_dir or _default_manual_dir()
    builder = AdabatchFashionMnist(data_dir=data_dir)
    # TFDS renames the finished folder into place, so its existence means "prepared"; it is
    # also what `download_and_prepare` checks (`is_prepared` would log a warning when absent).
    if builder.data_path.exists() or _has_idx_files(manual_dir):
        # A no-op when the dataset is already prepared in `data_dir`.
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(
                manual_dir=manual_dir, try_download_gcs=False
            )
        )
        return builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
    try:
        return _load_tfds_standard(split, data_dir)
    except Exception as exc:
        raise RuntimeError(_NOT_FOUND) from exc
