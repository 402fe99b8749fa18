"""Tests of `tf_adabatch.app.data`: the offline Fashion-MNIST builder, `load` and `parse_idx`.

The dataset is prepared once per module, from Debian's IDX files, into a temporary folder
(15 s or so); tests that need those files are skipped where they are not installed.
"""

from __future__ import annotations

import gzip
import os
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tf_adabatch.app import data
from tf_adabatch.app.data import fashion_mnist as fm

DEBIAN_DIR = Path(fm.DEFAULT_MANUAL_DIR)
needs_debian = pytest.mark.skipif(
    not all((DEBIAN_DIR / name).is_file() for pair in fm.IDX_FILES.values() for name in pair),
    reason=f"Debian's dataset-fashion-mnist is not installed ({DEBIAN_DIR} lacks the IDX files)",
)


@pytest.fixture(autouse=True)
def _no_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests pass folders explicitly, or set these variables themselves."""
    monkeypatch.delenv(fm.MANUAL_DIR_ENV, raising=False)
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TFDS data folder with `adabatch_fashion_mnist` prepared from the Debian files."""
    if not DEBIAN_DIR.is_dir():
        pytest.skip(f"Debian's dataset-fashion-mnist is not installed ({DEBIAN_DIR} missing)")
    path = tmp_path_factory.mktemp("tfds")
    data.load("train", data_dir=str(path), manual_dir=str(DEBIAN_DIR))
    return path


def _prepared_files(data_dir: Path) -> dict[str, float]:
    folder = data_dir / "adabatch_fashion_mnist" / "1.0.0"
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def _write_idx(folder: Path, *, images: int = 2, labels: int = 2) -> None:
    """Tiny stand-ins for the four IDX files: `images` black images, labels 0, 1, 2, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    for image_name, label_name in fm.IDX_FILES.values():
        header = struct.pack(">iiii", 2051, images, 28, 28)
        (folder / image_name).write_bytes(gzip.compress(header + bytes(images * 28 * 28)))
        header = struct.pack(">ii", 2049, labels)
        (folder / label_name).write_bytes(gzip.compress(header + bytes(range(labels))))


# --- the prepared dataset ---------------------------------------------------------------


@needs_debian
def test_split_sizes(data_dir: Path) -> None:
    info = data.AdabatchFashionMnist(data_dir=str(data_dir)).info
    assert info.splits["train"].num_examples == 60000
    assert info.splits["test"].num_examples == 10000
    assert info.features["label"].names == list(fm.CLASS_NAMES)
    assert info.supervised_keys == ("image", "label")
    assert "Xiao" in info.citation and info.redistribution_info.license == "MIT"
    for split, size in (("train", 60000), ("test", 10000)):
        ds = data.load(split, data_dir=str(data_dir), manual_dir=str(DEBIAN_DIR))
        assert int(ds.cardinality()) == size


@needs_debian
def test_element_spec(data_dir: Path) -> None:
    ds = data.load("train", data_dir=str(data_dir), manual_dir=str(DEBIAN_DIR))
    assert ds.element_spec == (
        tf.TensorSpec((28, 28, 1), tf.uint8),
        tf.TensorSpec((), tf.int64),
    )
    image, label = next(iter(ds))
    assert image.dtype == tf.uint8 and image.shape == (28, 28, 1)
    assert label.dtype == tf.int64


@needs_debian
def test_examples_equal_the_idx_files_in_order(data_dir: Path) -> None:
    """Images and labels are the raw IDX bytes, in the files' order (no shuffling)."""
    images = fm.parse_idx(DEBIAN_DIR / "train-images-idx3-ubyte.gz")
    labels = fm.parse_idx(DEBIAN_DIR / "train-labels-idx1-ubyte.gz")
    ds = data.load("train", data_dir=str(data_dir), manual_dir=str(DEBIAN_DIR))
    got_images, got_labels = next(iter(ds.batch(32)))
    np.testing.assert_array_equal(got_labels.numpy(), labels[:32])
    np.testing.assert_array_equal(got_images.numpy()[..., 0], images[:32])
    assert got_images.numpy().any()  # real pictures, not blanks


@needs_debian
def test_test_split_labels(data_dir: Path) -> None:
    expected = fm.parse_idx(DEBIAN_DIR / "t10k-labels-idx1-ubyte.gz")
    ds = data.load("test", data_dir=str(data_dir), manual_dir=str(DEBIAN_DIR))
    labels = np.concatenate([y.numpy() for _, y in ds.batch(2500)])
    assert labels.min() == 0 and labels.max() == 9
    np.testing.assert_array_equal(labels, expected)
    np.testing.assert_array_equal(np.bincount(labels), [1000] * 10)


@needs_debian
def test_second_load_reuses_the_prepared_files(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = _prepared_files(data_dir)
    assert "dataset_info.json" in before

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dataset was generated again")

    monkeypatch.setattr(fm.AdabatchFashionMnist, "_generate_examples", fail)
    monkeypatch.setattr(fm.AdabatchFashionMnist, "_split_generators", fail)
    ds = data.load("test", data_dir=str(data_dir), manual_dir=str(DEBIAN_DIR))
    assert int(ds.cardinality()) == 10000
    # Once prepared, the IDX files are no longer needed.
    empty = tmp_path / "empty"
    empty.mkdir()
    image, _ = next(iter(data.load("train", data_dir=str(data_dir), manual_dir=str(empty))))
    assert image.shape == (28, 28, 1)
    assert _prepared_files(data_dir) == before


@needs_debian
def test_defaults_come_from_the_environment(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFDS_DATA_DIR", str(data_dir))
    monkeypatch.setenv(fm.MANUAL_DIR_ENV, str(DEBIAN_DIR))
    monkeypatch.setattr(fm, "_load_tfds_standard", pytest.fail)
    before = _prepared_files(data_dir)
    assert int(data.load("test").cardinality()) == 10000
    assert _prepared_files(data_dir) == before


# --- fallbacks and errors (no Debian files needed) ----------------------------------------


def test_missing_files_and_no_download_raise_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = []

    def offline(split: str, data_dir: str) -> tf.data.Dataset:
        calls.append((split, data_dir))
        raise OSError("no network")

    monkeypatch.setattr(fm, "_load_tfds_standard", offline)
    for manual in (tmp_path / "empty", tmp_path / "missing"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(RuntimeError) as info:
            data.load("train", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
        message = str(info.value)
        assert message.startswith("Fashion-MNIST not found: install Debian's")
        assert "apt-get install dataset-fashion-mnist" in message
        assert "TF_ADABATCH_FASHION_MNIST_DIR" in message
        assert "`fashion_mnist`" in message
        assert isinstance(info.value.__cause__, OSError)
    assert calls == [("train", str(tmp_path / "tfds"))] * 2


def test_missing_files_from_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(fm.MANUAL_DIR_ENV, str(tmp_path / "missing"))
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    calls = []

    def offline(split: str, data_dir: str) -> tf.data.Dataset:
        calls.append((split, data_dir))
        raise OSError("no network")

    monkeypatch.setattr(fm, "_load_tfds_standard", offline)
    with pytest.raises(RuntimeError, match="Fashion-MNIST not found"):
        data.load("test")
    assert calls == [("test", str(tmp_path / "tfds"))]


def test_missing_files_fall_back_to_tfds_fashion_mnist(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    standard = tf.data.Dataset.from_tensors(
        (tf.zeros((28, 28, 1), tf.uint8), tf.constant(0, tf.int64))
    )
    monkeypatch.setattr(fm, "_load_tfds_standard", lambda split, data_dir: standard)
    ds = data.load("train", data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "none"))
    assert ds is standard


def test_partial_manual_dir_is_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Three of the four files: the builder is not tried (it would fail half-way)."""
    _write_idx(tmp_path / "manual")
    (tmp_path / "manual" / "t10k-labels-idx1-ubyte.gz").unlink()
    monkeypatch.setattr(fm, "_load_tfds_standard", lambda split, data_dir: "fallback")
    ds = data.load("test", data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual"))
    assert ds == "fallback"
    assert not (tmp_path / "tfds" / "adabatch_fashion_mnist" / "1.0.0").exists()


def test_builder_on_tiny_files(tmp_path: Path) -> None:
    _write_idx(tmp_path / "manual", images=3, labels=3)
    ds = data.load("test", data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual"))
    assert [int(y) for _, y in ds] == [0, 1, 2]


def test_builder_rejects_mismatched_files(tmp_path: Path) -> None:
    _write_idx(tmp_path / "manual", images=2, labels=3)
    with pytest.raises(ValueError, match=r"holds 2 images but .* holds 3 labels"):
        data.load("train", data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual"))
    assert not (tmp_path / "tfds" / "adabatch_fashion_mnist" / "1.0.0").exists()


# --- parse_idx ----------------------------------------------------------------------------


def test_parse_idx_reads_images_and_labels(tmp_path: Path) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = struct.pack(">iiii", 2051, 2, 3, 4) + images.tobytes()
    np.testing.assert_array_equal(fm.parse_idx(raw), images)
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(raw))
    np.testing.assert_array_equal(fm.parse_idx(path), images)
    np.testing.assert_array_equal(fm.parse_idx(str(path), expected_magic=2051), images)
    labels = struct.pack(">ii", 2049, 2) + bytes([5, 6])
    np.testing.assert_array_equal(fm.parse_idx(labels), [5, 6])
    assert fm.parse_idx(labels).dtype == np.uint8


def test_parse_idx_rejects_a_wrong_magic_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(struct.pack(">ii", 2050, 2) + bytes([5, 6])))
    with pytest.raises(ValueError, match=r"bad\.gz: IDX magic number 2050, expected 2051"):
        fm.parse_idx(path)
    labels = struct.pack(">ii", 2049, 2) + bytes([5, 6])
    with pytest.raises(ValueError, match=r"magic number 2049 \(labels\), expected 2051"):
        fm.parse_idx(labels, expected_magic=2051)
    with pytest.raises(ValueError, match="magic number"):
        fm.parse_idx(b"PK\x03\x04 not an idx file")


def test_parse_idx_rejects_wrong_counts() -> None:
    with pytest.raises(ValueError, match=r"announces 3 items .* holds 2 bytes"):
        fm.parse_idx(struct.pack(">ii", 2049, 3) + bytes([1, 2]))
    with pytest.raises(ValueError, match=r"announces 1 items .* holds 5 bytes"):
        fm.parse_idx(struct.pack(">iiii", 2051, 1, 2, 2) + bytes(5))
    with pytest.raises(ValueError, match="truncated IDX header"):
        fm.parse_idx(struct.pack(">iii", 2051, 1, 2))
    with pytest.raises(ValueError, match="too short"):
        fm.parse_idx(b"\x00\x00")


def test_module_reimport_does_not_register_twice() -> None:
    """Importing the module a second time (new module object) must not crash TFDS."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fashion_mnist_copy", fm.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.AdabatchFashionMnist.name == "adabatch_fashion_mnist"


def test_public_api() -> None:
    assert data.__all__ == ["AdabatchFashionMnist", "load", "parse_idx"]
    assert os.fspath(fm.DEFAULT_MANUAL_DIR) == "/usr/share/datasets/fashion-mnist"


def test_offline_fallback_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The real fallback, offline: the DNS check stops it before TFDS's minutes of retries."""

    def no_dns(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Fashion-MNIST not found") as info:
        data.load("test", data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "none"))
    assert time.monotonic() - start < 10
    assert "cannot reach fashion-mnist" in str(info.value.__cause__)
