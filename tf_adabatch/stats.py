"""Gradient-noise statistics: pure TensorFlow math, no variables, no tf.distribute.

Notation (see ``docs/algorithms.md``): in one optimizer step, ``n`` micro-gradients
``g_1..g_n``, each the mean gradient over ``m`` examples; global batch ``B = n * m``;
``gbar`` their mean (the gradient that is applied); ``G`` the true gradient and
``tr(Sigma)`` the trace of the per-example gradient covariance, so that

    E|g_i|^2 = |G|^2 + tr(Sigma) / m,        E|gbar|^2 = |G|^2 + tr(Sigma) / B.

Every function here takes and returns ``tf.float64`` scalars (callers cast), is
graph-safe and XLA-compilable, and never raises on data: undefined quantities come
back as NaN or inf so that a caller decides what to do with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

__all__ = [
    "NoiseMoments",
    "adascale_gain",
    "clip_moments",
    "cosine_similarity",
    "debias",
    "default_decay",
    "differenced_moments",
    "dot",
    "ema_update",
    "estimated_similarity",
    "noise_scale",
    "promote_to_float32",
    "replica_similarity",
    "step_moments",
    "sum_of_squares",
]

_F64 = tf.float64


class NoiseMoments(NamedTuple):
    """The two moments the gradient noise is summarised by.

    Attributes:
      grad_sqr: estimate of |G|^2, the squared norm of the true gradient.
      trace_sigma: estimate of tr(Sigma), the per-example gradient variance.

    >>> NoiseMoments(grad_sqr=4.0, trace_sigma=68.0).trace_sigma
    68.0
    """

    grad_sqr: tf.Tensor
    trace_sigma: tf.Tensor


def _f64(x: tf.Tensor | float | int) -> tf.Tensor:
    # `tf.cast(0.9, tf.float64)` would round the Python float to float32 first.
    return tf.cast(tf.convert_to_tensor(x, dtype_hint=_F64), _F64)


def promote_to_float32(x: tf.Tensor) -> tf.Tensor:
    """`x` in float32 if it is a 16-bit float (whose sums overflow or lose precision).

    Reductions over a whole tensor (squared norms, inner products, the roll-back's
    finiteness sums) are taken in the tensor's dtype promoted to at least float32.

    >>> promote_to_float32(tf.constant([1.0], tf.float16)).dtype.name
    'float32'
    >>> promote_to_float32(tf.constant([1.0], tf.float64)).dtype.name
    'float64'
    """
    return tf.cast(x, tf.float32) if x.dtype in (tf.float16, tf.bfloat16) else x


def sum_of_squares(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Returns sum_j |t_j|^2 over a list of tensors, as a float64 scalar.

    Each tensor's own sum is taken in its dtype promoted to at least float32, in one
    fused pass (`tf.nn.l2_loss`: no squared copy of the tensor is allocated); the
    per-tensor sums are added in float64.

    Example:

    >>> float(sum_of_squares([tf.constant([3.0]), tf.constant([[4.0]])]))
    25.0
    """
    if not tensors:
        return tf.constant(0.0, _F64)
    # tf.nn.l2_loss: sum(x^2) / 2 in one pass.
    parts = [_f64(tf.nn.l2_loss(promote_to_float32(x))) for x in tensors]
    return 2.0 * tf.add_n(parts)


def dot(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor]) -> tf.Tensor:
    """Returns the inner product of two lists of tensors flattened into one vector.

    Example:

    >>> float(dot([tf.constant([1.0, 2.0])], [tf.constant([3.0, -1.0])]))
    1.0
    """
    if len(a) != len(b):
        raise ValueError(f"`a` and `b` must have the same length. Received: {len(a)} and {len(b)}")
    if not a:
        return tf.constant(0.0, _F64)
    parts = []
    for x, y in zip(a, b, strict=True):
        x = promote_to_float32(x)
        parts.append(_f64(tf.reduce_sum(x * tf.cast(y, x.dtype))))
    return tf.add_n(parts)


def step_moments(
    mean_sq: tf.Tensor, grad_mean_sq: tf.Tensor, num_micro: tf.Tensor, micro_batch_size: tf.Tensor
) -> NoiseMoments:
    """Unbiased one-step estimates of |G|^2 and tr(Sigma) from n >= 2 micro-gradients.

    With ``mean_sq = (1/n) sum_i |g_i|^2`` and ``grad_mean_sq = |gbar|^2``:

        tr(Sigma) = (mean_sq - |gbar|^2) / (1/m - 1/B) = m n (mean_sq - |gbar|^2) / (n - 1)
        |G|^2     = (B |gbar|^2 - m mean_sq) / (B - m)  = (n |gbar|^2 - mean_sq) / (n - 1)

    This is the estimator of fairscale's AdaScale (there written in terms of the
    variance of one base-batch gradient). For ``n < 2`` both outputs are NaN.

    Args:
      mean_sq: mean over micro-gradients of their squared norms.
      grad_mean_sq: squared norm of the mean micro-gradient.
      num_micro: n, the number of micro-gradients.
      micro_batch_size: m, examples per micro-gradient.

    Returns:
      `NoiseMoments(grad_sqr, trace_sigma)`.

    Example (two micro-gradients [1, 0] and [0, 1] of one example each:
    mean_sq = 1, gbar = [0.5, 0.5], |gbar|^2 = 0.5):

    >>> moments = step_moments(1.0, 0.5, 2.0, 1.0)
    >>> float(moments.grad_sqr), float(moments.trace_sigma)
    (0.0, 1.0)
    """
    n = _f64(num_micro)
    m = _f64(micro_batch_size)
    mean_sq = _f64(mean_sq)
    grad_mean_sq = _f64(grad_mean_sq)
    # n - 1 <= 0 gives NaN through 0/0 or a sign flip: mask it explicitly.
    denom = tf.where(n >= 2.0, n - 1.0, tf.constant(float("nan"), _F64))
    trace_sigma = m * n * (mean_sq - grad_mean_sq) / denom
    grad_sqr = (n * grad_mean_sq - mean_sq) / denom
    return NoiseMoments(grad_sqr, trace_sigma)


def differenced_moments(
    dot_prev: tf.Tensor,
    diff_sq: tf.Tensor,
    batch_size: tf.Tensor,
    prev_batch_size: tf.Tensor,
) -> NoiseMoments:
    """Estimates from two consecutive gradients, for a single gradient per step.

    AdaptDL's differenced estimator, generalised to unequal batches: with g_t over B_t
    examples and g_{t-1} over B_{t-1} examples (assumed independent and with nearly the
    same mean),

        |G|^2     ~ g_{t-1} . g_t
        tr(Sigma) ~ |g_t - g_{t-1}|^2 / (1/B_t + 1/B_{t-1})

    (for B_t = B_{t-1} = m the second is AdaptDL's (m/2)|g_t - g_{t-1}|^2).

    Args:
      dot_prev: g_{t-1} . g_t.
      diff_sq: |g_t - g_{t-1}|^2.
      batch_size: B_t.
      prev_batch_size: B_{t-1}.

    Returns:
      `NoiseMoments(grad_sqr, trace_sigma)`.

    Example:

    >>> moments = differenced_moments(2.0, 4.0, 2.0, 2.0)
    >>> float(moments.grad_sqr), float(moments.trace_sigma)
    (2.0, 4.0)
    """
    inv = 1.0 / _f64(batch_size) + 1.0 / _f64(prev_batch_size)
    return NoiseMoments(_f64(dot_prev), _f64(diff_sq) / inv)


def clip_moments(
    moments: NoiseMoments, base_batch_size: tf.Tensor, min_variance: float = 1e-6
) -> NoiseMoments:
    """Clips one step's estimates before they are averaged, as fairscale does.

    fairscale clips the variance of one base-batch gradient, sigma^2 = tr(Sigma)/B0, at
    ``min_variance`` and |G|^2 at 0. Expressed per example: tr(Sigma) >= min_variance*B0.

    Example:

    >>> clipped = clip_moments(NoiseMoments(tf.constant(-1.0, tf.float64),
    ...                                     tf.constant(0.0, tf.float64)), 4.0)
    >>> float(clipped.grad_sqr), float(clipped.trace_sigma)
    (0.0, 4e-06)
    """
    floor = _f64(min_variance) * _f64(base_batch_size)
    return NoiseMoments(
        tf.maximum(_f64(moments.grad_sqr), 0.0), tf.maximum(_f64(moments.trace_sigma), floor)
    )


def default_decay(num_micro: tf.Tensor) -> tf.Tensor:
    """fairscale's smoothing factor theta = max(1 - n/1000, 0) for n micro-gradients.

    Example:

    >>> float(default_decay(2.0))
    0.998
    """
    return tf.maximum(1.0 - _f64(num_micro) / 1000.0, 0.0)


def ema_update(
    biased: tf.Tensor, weight: tf.Tensor, value: tf.Tensor, decay: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """One step of an exponential moving average that stays debiasable.

    ``biased <- decay*biased + (1-decay)*value`` and ``weight <- decay*weight +
    (1-decay)``; ``biased / weight`` is the debiased average. For a constant decay
    theta, weight = 1 - theta^t, which is Adam's (and fairscale's) correction; the
    recursion also stays exact when the decay changes from step to step (it does here,
    because the number of micro-gradients does).

    Example:

    >>> b, w = ema_update(0.0, 0.0, 5.0, 0.9)
    >>> float(debias(b, w))
    5.0
    """
    decay = _f64(decay)
    return (
        decay * _f64(biased) + (1.0 - decay) * _f64(value),
        decay * _f64(weight) + (1.0 - decay),
    )


def debias(biased: tf.Tensor, weight: tf.Tensor) -> tf.Tensor:
    """Debiased moving average; NaN before the first update (weight 0).

    Example:

    >>> float(debias(0.5, 0.25))
    2.0
    """
    weight = _f64(weight)
    safe = tf.where(weight > 0.0, weight, 1.0)
    return tf.where(weight > 0.0, _f64(biased) / safe, tf.constant(float("nan"), _F64))


def adascale_gain(
    grad_sqr: tf.Tensor, trace_sigma: tf.Tensor, batch_size: tf.Tensor, base_batch_size: tf.Tensor
) -> tf.Tensor:
    """AdaScale's gain ratio r = (sigma^2 + mu^2) / (sigma^2/S + mu^2).

    With sigma^2 = tr(Sigma)/B0 (the variance of one base-batch gradient), mu^2 = |G|^2
    and S = B/B0. r lies in [1, S] (in [S, 1] if S < 1): ~S when noise dominates, ~1
    when the gradient is nearly exact. Returns 1 where the statistics are undefined
    (NaN, or both moments zero), so that the learning rate falls back to the base one.

    Args:
      grad_sqr: |G|^2 (smoothed).
      trace_sigma: tr(Sigma) per example (smoothed).
      batch_size: B, the current global batch.
      base_batch_size: B0, the batch the base learning rate was tuned for.

    Returns:
      The gain r, float64.

    Example (pure noise: r = S; exact gradient: r = 1):

    >>> float(adascale_gain(0.0, 1.0, 64.0, 16.0)), float(adascale_gain(1.0, 0.0, 64.0, 16.0))
    (4.0, 1.0)

    References:
      Johnson, Agrawal, Gu, Guestrin. AdaScale SGD: A User-Friendly Algorithm for
      Distributed Training. ICML 2020.
    """
    mu2 = _f64(grad_sqr)
    b = _f64(batch_size)
    b0 = _f64(base_batch_size)
    tr = _f64(trace_sigma)
    num = tr / b0 + mu2
    den = tr / b + mu2
    scale = b / b0
    ok = tf.math.is_finite(num) & tf.math.is_finite(den) & (den > 0.0)
    gain = tf.where(ok, num / tf.where(ok, den, 1.0), 1.0)
    return tf.clip_by_value(gain, tf.minimum(scale, 1.0), tf.maximum(scale, 1.0))


def noise_scale(grad_sqr: tf.Tensor, trace_sigma: tf.Tensor) -> tf.Tensor:
    """The simple noise scale B_noise = tr(Sigma) / |G|^2 (McCandlish et al., 2018).

    Pass *smoothed* moments: the ratio of averages, not an average of ratios (which is
    biased). Returns +inf where |G|^2 = 0 < tr(Sigma).

    Example:

    >>> float(noise_scale(2.0, 64.0))
    32.0
    """
    g = _f64(grad_sqr)
    tr = _f64(trace_sigma)
    safe = tf.where(g > 0.0, g, 1.0)
    undefined = tf.where(tr > 0.0, tf.constant(float("inf"), _F64), tf.constant(float("nan"), _F64))
    return tf.where(g > 0.0, tr / safe, undefined)


def cosine_similarity(dot_ab: tf.Tensor, sq_a: tf.Tensor, sq_b: tf.Tensor) -> tf.Tensor:
    """cos(a, b) = a.b / (|a| |b|) from the three inner products; NaN for a zero vector.

    Example:

    >>> float(cosine_similarity(1.0, 1.0, 4.0))
    0.5
    """
    denom = tf.sqrt(_f64(sq_a)) * tf.sqrt(_f64(sq_b))
    safe = tf.where(denom > 0.0, denom, 1.0)
    return tf.where(denom > 0.0, _f64(dot_ab) / safe, tf.constant(float("nan"), _F64))


def estimated_similarity(
    grad_sqr: tf.Tensor, trace_sigma: tf.Tensor, batch_size: tf.Tensor
) -> tf.Tensor:
    """Expected cosine of two independent half-batch gradients, from the moments alone.

    Each half averages B/2 examples, so g_A = G + e_A with E|e_A|^2 = 2 tr(Sigma)/B, and
    in high dimension cos(g_A, g_B) ~ |G|^2 / (|G|^2 + 2 tr(Sigma)/B). This costs no
    second gradient-sized all-reduce. NaN where the denominator is not positive.

    On one replica the engine feeds it one step's unbiased moments (`step_moments`,
    unclipped; on N >= 2 replicas it uses `replica_similarity`). With n >= 2
    micro-gradients of m examples (B = n m) that is

        c = (B |gbar|^2 - m mean_sq) / ((B - 2m) |gbar|^2 + m mean_sq),

    whose denominator is positive and which lies in [-1, 1] (as a cosine does), since
    |gbar|^2 <= mean_sq. It is the ratio of expectations, not E[cos]: with few noise
    directions it underestimates the cosine (docs/algorithms.md).

    Example:

    >>> float(estimated_similarity(1.0, 8.0, 16.0))
    0.5
    """
    g = _f64(grad_sqr)
    den = g + 2.0 * _f64(trace_sigma) / _f64(batch_size)
    safe = tf.where(den > 0.0, den, 1.0)
    return tf.where(den > 0.0, g / safe, tf.constant(float("nan"), _F64))


def replica_similarity(
    total_sq: tf.Tensor, sum_sq: tf.Tensor, sum_norm: tf.Tensor, num_replicas: int
) -> tf.Tensor:
    """Similarity of two half-batches from the replicas' own gradient norms (N >= 2).

    With h_r the sum of replica r's micro-gradients (r = 1..N), the three scalars
    T = |sum_r h_r|^2, Q = sum_r |h_r|^2 and R = sum_r |h_r| give, exactly,

        sum_{r != s} h_r.h_s = T - Q,     sum_{r != s} |h_r| |h_s| = R^2 - Q,

    so c_1 = (T - Q) / (R^2 - Q) is the norm-weighted mean cosine of the replicas'
    gradients (B/N examples each), measured like exact mode's cosine: each pair's inner
    product over the product of its norms. The first-order model of the noise,
    c(b) = |G|^2 / (|G|^2 + tr(Sigma)/b), carries it from B/N to B/2 examples:

        c = N c_1 / ((N - 2) c_1 + 2).

    With N = 2 that is c_1 = cos(h_1, h_2), exact mode's cosine of its two groups (one
    replica each). With N > 2 the groups' own norms are not known from scalars; the
    estimate keeps the pairs' norms (the part of E[cos] that the moments' formula
    |G|^2 / (|G|^2 + 2 tr(Sigma)/B) misses when the noise lives in few directions) and is
    the first-order value in high dimension. NaN where a denominator is not positive (a
    replica with a zero gradient, say); clipped to [-1, 1].

    Args:
      total_sq: T, the squared norm of the sum of all micro-gradients.
      sum_sq: Q, the replicas' squared norms |h_r|^2, summed.
      sum_norm: R, the replicas' norms |h_r|, summed.
      num_replicas: N >= 2 (a Python int).

    Example (two replicas with h_1 = [1, 0], h_2 = [1, 1]: T = 5, Q = 1 + 2,
    R = 1 + sqrt(2); their cosine is cos 45 degrees):

    >>> round(float(replica_similarity(5.0, 3.0, 1.0 + 2.0 ** 0.5, 2)), 6)
    0.707107
    """
    if num_replicas < 2:
        raise ValueError(
            f"Argument `num_replicas` must be >= 2. Received: num_replicas={num_replicas}"
        )
    nan = tf.constant(float("nan"), _F64)
    q, r = _f64(sum_sq), _f64(sum_norm)
    pairs = r * r - q
    c1 = (_f64(total_sq) - q) / tf.where(pairs > 0.0, pairs, 1.0)
    n = float(num_replicas)
    den = (n - 2.0) * c1 + 2.0
    c = n * c1 / tf.where(den > 0.0, den, 1.0)
    return tf.where((pairs > 0.0) & (den > 0.0), tf.clip_by_value(c, -1.0, 1.0), nan)
