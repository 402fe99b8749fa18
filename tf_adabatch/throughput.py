"""Online throughput model: step time T(k) = alpha + beta * k, fitted robustly from timings.

k is the number of micro-steps per replica in an optimizer step; alpha the per-step
fixed part (gradient all-reduce, statistics, apply, host overhead) and beta one
micro-step (forward and backward pass of one micro-batch on every replica). The host
times each optimizer step and calls `observe`; the fit lives in `tf.Variable`s, so a
policy reads it inside `tf.function` (no retrace when it changes) and checkpoints keep
it (a resumed run predicts exactly what the uninterrupted one would).

Robustness on a shared, noisy machine: the observations are kept in a window, reduced
to the *median* step time per distinct k, and the line is a least-squares fit through
those medians (weighted by how many timings each has). A median ignores any minority of
outliers, so a few slow steps (another process, a garbage collection) move nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_adabatch._checks import integer

__all__ = ["ThroughputModel", "fit_line", "fit_line_graph"]

_F64 = tf.float64


class ThroughputModel(tf.Module):
    """Step time against micro-steps, T(k) = alpha + beta k, from a window of timings.

    Args:
      window: how many of the latest timings the fit uses.
      min_timings_per_k: timings a value of k needs before its median counts.

    Attributes (after `build` or the first `observe`): `alpha`, `beta` (seconds;
    float64 variables), `ready` (1 once two or more values of k have enough timings,
    else 0).

    Example (timings of a step costing 10 ms plus 5 ms per micro-step, one outlier):

    >>> model = ThroughputModel(min_timings_per_k=2)
    >>> for k, seconds in [(1, 0.015), (1, 0.015), (2, 0.020), (2, 0.9), (2, 0.020),
    ...                    (4, 0.030), (4, 0.030)]:
    ...     model.observe(k, seconds)
    >>> round(float(model.alpha), 4), round(float(model.beta), 4)
    (0.01, 0.005)
    >>> round(float(model.predict_step_time(8)), 4)
    0.05
    """

    def __init__(self, *, window: int = 200, min_timings_per_k: int = 3) -> None:
        super().__init__(name="throughput")
        self.window = integer("window", window)
        self.min_timings_per_k = integer("min_timings_per_k", min_timings_per_k)
        self.built = False
        self._observe_fn: Any = None

    def build(self) -> None:
        """Creates the variables (once). `GoodputPolicy.build` calls it in the strategy's
        scope; `observe` calls it if nobody did. Constructing the model runs no
        TensorFlow op, so a config can be checked before the strategy exists."""
        if self.built:
            return
        agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
        with self.name_scope:
            self.timings_k = tf.Variable(
                tf.zeros([self.window], _F64), trainable=False, aggregation=agg, name="timings_k"
            )
            self.timings_s = tf.Variable(
                tf.zeros([self.window], _F64), trainable=False, aggregation=agg, name="timings_s"
            )
            self.count = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, aggregation=agg, name="count"
            )
            self.alpha = tf.Variable(
                tf.constant(0.0, _F64), trainable=False, aggregation=agg, name="alpha"
            )
            self.beta = tf.Variable(
                tf.constant(0.0, _F64), trainable=False, aggregation=agg, name="beta"
            )
            self.ready = tf.Variable(
                tf.constant(0, tf.int64), trainable=False, aggregation=agg, name="ready"
            )
        self.built = True

    def observe(self, k: int, seconds: float) -> None:
        """Adds one timed optimizer step of `k` micro-steps and refits. Host code only.

        One call of a compiled function (ring-buffer write and fit in the graph, no
        read back to the host): the goodput policy pays it every step, and the
        earlier version, reading the window to numpy and fitting there, cost 8.5 ms
        a step with 4 replicas (2026-12-04), a quarter of a Fashion-MNIST step here.
        """
        if not (np.isfinite(seconds) and seconds > 0):
            return  # nothing to learn from a failed or zero timing
        self.build()
        if self._observe_fn is None:
            self._observe_fn = tf.function(self._observe, autograph=False)
        self._observe_fn(tf.constant(float(k), _F64), tf.constant(float(seconds), _F64))

    def record(self, k: tf.Tensor, seconds: tf.Tensor, *, refit: bool = True) -> None:
        """Adds one timing of a step of `k` micro-steps, graph-safe (float64 tensors;
        inside a `tf.function` or eagerly; call `build` first). `observe` is the host's
        way (it skips failed timings and compiles the call); this one is for code that
        already runs in a graph, such as a simulator pricing steps with a model.
        `refit=False` only appends to the window and leaves alpha, beta and ready as they
        are (for a policy that reads the timings, not the line).

        >>> model = ThroughputModel(min_timings_per_k=1)
        >>> model.build()
        >>> model.record(tf.constant(1.0, tf.float64), tf.constant(3.0, tf.float64))
        >>> model.record(tf.constant(2.0, tf.float64), tf.constant(5.0, tf.float64))
        >>> float(model.alpha), float(model.beta), int(model.count)
        (1.0, 2.0, 2)
        """
        if refit:
            self._observe(k, seconds)
            return
        slot = self._slot()
        self.timings_k.scatter_nd_update(slot, tf.reshape(tf.cast(k, _F64), [1]))
        self.timings_s.scatter_nd_update(slot, tf.reshape(tf.cast(seconds, _F64), [1]))
        self.count.assign_add(1)

    def _slot(self) -> tf.Tensor:
        """Where the next timing goes: the window is a ring (the oldest is replaced)."""
        return tf.reshape(self.count % self.window, [1, 1])

    def _observe(self, k: tf.Tensor, seconds: tf.Tensor) -> None:
        slot = self._slot()
        ks = tf.tensor_scatter_nd_update(self.timings_k.read_value(), slot, tf.reshape(k, [1]))
        times = tf.tensor_scatter_nd_update(
            self.timings_s.read_value(), slot, tf.reshape(seconds, [1])
        )
        count = self.count + 1
        used = tf.minimum(count, self.window)
        alpha, beta, ok = fit_line_graph(ks[:used], times[:used], self.min_timings_per_k)
        self.timings_k.assign(ks)
        self.timings_s.assign(times)
        self.count.assign(count)
        # As before: a fit that is not ready leaves the last good alpha and beta.
        self.alpha.assign(tf.where(ok, alpha, self.alpha))
        self.beta.assign(tf.where(ok, beta, self.beta))
        self.ready.assign(tf.cast(ok, tf.int64))

    def timings_at(self, k: tf.Tensor | float) -> tf.Tensor:
        """How many timings in the window are of steps with `k` micro-steps (graph-safe)."""
        used = tf.minimum(self.count, self.window)
        in_window = tf.range(self.window, dtype=tf.int64) < used
        same = tf.equal(self.timings_k, tf.cast(k, _F64)) & in_window
        return tf.reduce_sum(tf.cast(same, tf.int64))

    def predict_step_time(self, k: tf.Tensor | float) -> tf.Tensor:
        """Predicted seconds of one optimizer step with `k` micro-steps per replica
        (graph-safe; meaningful once `ready`)."""
        return self.alpha + self.beta * tf.cast(k, _F64)


def fit_line(
    ks: np.ndarray, seconds: np.ndarray, min_timings_per_k: int = 1
) -> tuple[float, float, bool]:
    """(alpha, beta, ok): least squares through the per-k medians, weighted by counts.

    ok is False (and alpha, beta 0) with fewer than two values of k that have
    `min_timings_per_k` timings each.

    The numpy reference of the fit: `ThroughputModel.observe` runs the same fit in
    the graph (`fit_line_graph`), and tests/test_goodput.py checks one against the
    other. The package itself no longer calls this; it is kept for tests and for
    fitting logged timings offline.

    Example:

    >>> fit_line(np.array([1.0, 2.0, 2.0, 2.0]), np.array([3.0, 5.0, 5.0, 99.0]))
    (1.0, 2.0, True)
    """
    points, weights = [], []
    for k in np.unique(ks):
        mine = seconds[ks == k]
        if len(mine) >= min_timings_per_k:
            points.append((float(k), float(np.median(mine))))
            weights.append(float(len(mine)))
    if len(points) < 2:
        return 0.0, 0.0, False
    k_values, medians = np.array(points).T
    w = np.array(weights)
    k_mean = np.average(k_values, weights=w)
    t_mean = np.average(medians, weights=w)
    beta = float(
        np.sum(w * (k_values - k_mean) * (medians - t_mean)) / np.sum(w * (k_values - k_mean) ** 2)
    )
    alpha = float(t_mean - beta * k_mean)
    return alpha, beta, True


def fit_line_graph(
    ks: tf.Tensor, seconds: tf.Tensor, min_timings_per_k: int = 1
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`fit_line` in TensorFlow ops (graph-safe; float64 in, float64 alpha, beta, bool ok).

    The same fit: timings sorted by (k, seconds) with two stable sorts, the median of
    each run of equal k (the mean of the two middle values for an even count, as
    numpy's), and the weighted least-squares line through the medians with at least
    `min_timings_per_k` timings. tests/test_goodput.py compares it with `fit_line`.

    Example:

    >>> alpha, beta, ok = fit_line_graph(
    ...     tf.constant([1.0, 2.0, 2.0, 2.0], tf.float64), tf.constant([3.0, 5.0, 5.0, 99.0], tf.float64))
    >>> float(alpha), float(beta), bool(ok)
    (1.0, 2.0, True)
    """
    by_time = tf.argsort(seconds, stable=True)
    ks, seconds = tf.gather(ks, by_time), tf.gather(seconds, by_time)
    by_k = tf.argsort(ks, stable=True)
    ks, seconds = tf.gather(ks, by_k), tf.gather(seconds, by_k)
    values, _, counts = tf.unique_with_counts(ks, out_idx=tf.int64)  # in sorted order
    starts = tf.cumsum(counts, exclusive=True)
    medians = 0.5 * (
        tf.gather(seconds, starts + (counts - 1) // 2) + tf.gather(seconds, starts + counts // 2)
    )
    kept = counts >= min_timings_per_k
    k_values, medians = tf.boolean_mask(values, kept), tf.boolean_mask(medians, kept)
    w = tf.cast(tf.boolean_mask(counts, kept), _F64)
    ok = tf.size(k_values) >= 2
    k_mean = tf.math.divide_no_nan(tf.reduce_sum(w * k_values), tf.reduce_sum(w))
    t_mean = tf.math.divide_no_nan(tf.reduce_sum(w * medians), tf.reduce_sum(w))
    beta = tf.math.divide_no_nan(
        tf.reduce_sum(w * (k_values - k_mean) * (medians - t_mean)),
        tf.reduce_sum(w * (k_values - k_mean) ** 2),
    )
    alpha = t_mean - beta * k_mean
    zero = tf.constant(0.0, _F64)
    return tf.where(ok, alpha, zero), tf.where(ok, beta, zero), ok
