"""Input pipelines: in-memory arrays to per-replica micro-batches, and the small datasets.

Durations and positions are in examples; the pipeline converts them to micro-batches in
one place (`train_dataset_fn`), which matters when the batch size changes every step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import tensorflow as tf

__all__ = ["DATASETS", "TEXT_DATASETS", "eval_dataset", "load_arrays", "train_dataset_fn"]

DATASETS = ("fashion_mnist", "digits", "synthetic", "python_text")
#: The datasets of token sequences (next-token labels per position), for the language model.
TEXT_DATASETS = ("python_text",)

Arrays = tuple[np.ndarray, np.ndarray]


def train_dataset_fn(
    x: np.ndarray,
    y: np.ndarray,
    *,
    micro_batch_size: int,
    seed: int,
    skip_micro_batches: int = 0,
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """A `distribute_datasets_from_function` input: shuffled, repeated micro-batches.

    Each input pipeline (one per worker) takes its shard of the examples, shuffles
    them with `seed` (a new order every epoch, the same orders on every run), repeats,
    and batches `micro_batch_size` examples per replica. `skip_micro_batches` (all
    pipelines together) resumes an interrupted run where it stopped.

    Example:

    >>> fn = train_dataset_fn(np.arange(10.0), np.arange(10), micro_batch_size=4, seed=0)
    >>> x, y = next(iter(fn(tf.distribute.InputContext())))
    >>> x.shape.as_list()
    [4]
    """

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        shard_size = (
            len(x) - ctx.input_pipeline_id + ctx.num_input_pipelines - 1
        ) // ctx.num_input_pipelines
        ds = ds.shuffle(shard_size, seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(micro_batch_size, drop_remainder=True)
        ds = ds.skip(skip_micro_batches // ctx.num_input_pipelines)
        return ds.prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def eval_dataset(x: np.ndarray, y: np.ndarray, batch_size: int) -> tf.data.Dataset:
    """The evaluation set in order, in global batches (the last one may be short).

    >>> int(eval_dataset(np.zeros((5, 2)), np.zeros(5), 2).cardinality())
    3
    """
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


@functools.lru_cache(maxsize=4)
def load_arrays(name: str, *, seed: int = 0) -> tuple[Arrays, Arrays, int]:
    """(train, test, num_classes): float32 images in [0, 1] (N, H, W, 1) and int labels,
    or, for a text dataset, token windows and their next-token labels.

    Cached per process (the arrays are shared: do not modify them).

    - "fashion_mnist": 60k/10k, through the offline TFDS builder (`tf_adabatch.app.data`).
    - "digits": scikit-learn's 1,797 8x8 digits, split 1,497/300 with `seed`.
    - "synthetic": 4,096/1,024 random 8x8 images whose label is a fixed linear rule
      (learnable, noisy enough for the statistics), for tests.
    - "python_text": byte windows (N, 64) int32 of 100 modules of Python source
      generated from a fixed seed, labels the next byte at each position (N, 64), 256
      classes, split by module (`tf_adabatch.app.data.python_text`: pinned by hashes).

    Example:

    >>> (x, y), (xt, yt), classes = load_arrays("synthetic")
    >>> x.shape, xt.shape, classes
    ((4096, 8, 8, 1), (1024, 8, 8, 1), 10)
    """
    if name not in DATASETS:
        raise ValueError(f"Argument `name` must be one of {DATASETS}. Received: name={name!r}")
    if name == "fashion_mnist":
        from tf_adabatch.app.data import fashion_mnist

        def arrays(split: str) -> Arrays:
            images, labels = [], []
            for image, label in fashion_mnist.load(split).batch(10000).as_numpy_iterator():
                images.append(image)
                labels.append(label)
            return (
                np.concatenate(images).astype(np.float32) / 255.0,
                np.concatenate(labels).astype(np.int64),
            )

        return arrays("train"), arrays("test"), 10
    if name == "python_text":
        from tf_adabatch.app.data import python_text

        train, validation = python_text.load()
        return train, validation, python_text.VOCABULARY
    rng = np.random.default_rng(seed)
    if name == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError as err:
            raise ImportError(
                "The digits dataset ships with scikit-learn, which is not installed: "
                "`pip install scikit-learn` (or `pip install -e '.[test]'`)."
            ) from err

        digits = load_digits()
        order = rng.permutation(len(digits.target))
        x = (digits.images[order] / 16.0).astype(np.float32)[..., None]
        y = digits.target[order].astype(np.int64)
        return (x[300:], y[300:]), (x[:300], y[:300]), 10
    x = rng.normal(size=(5120, 8, 8, 1)).astype(np.float32)
    w = rng.normal(size=(64, 10))
    logits = x.reshape(len(x), -1) @ w + 2.0 * rng.gumbel(size=(len(x), 10))
    y = logits.argmax(-1).astype(np.int64)
    return (x[:4096], y[:4096]), (x[4096:], y[4096:]), 10
