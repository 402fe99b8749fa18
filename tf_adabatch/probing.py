"""Goodput by probing: compare a neighbouring batch's *measured* progress rate with this one's.

`GoodputPolicy` (Pollux) prices every batch B with the gain the statistics measured at
the batch it runs would give at B, and with a straight-line step-time model
T(k) = alpha + beta k fitted to the timings seen so far. Both extrapolate: the noise
scale measured along a large-batch run is several times the one along a small-batch
run at equal progress (the Pollux traces, issue 45), and a line fitted through two
neighbouring k where communication hides the compute has almost no slope, so large
batches look free. `ProbingGoodputPolicy` extrapolates nothing: it measures.
"""

from __future__ import annotations

import math

import tensorflow as tf

from tf_adabatch._checks import integer
from tf_adabatch.policies import GoodputPolicy, StepStats
from tf_adabatch.throughput import ThroughputModel

__all__ = ["ProbingGoodputPolicy"]

_F64 = tf.float64


def _ladder(low: int, high: int, base: int, unit: int, factor: int) -> list[int]:
    """The batches the policy moves between: base x factor^j rounded to a multiple of
    `unit` (nearest, half up), clipped to [low, high], with both bounds.

    >>> _ladder(40, 640, 20, 4, 2)
    [40, 80, 160, 320, 640]
    >>> _ladder(320, 12800, 200, 16, 2)
    [320, 400, 800, 1600, 3200, 6400, 12800]
    """
    rungs = {low, high}
    batch = base
    while batch <= high:
        rounded = (2 * batch + unit) // (2 * unit) * unit
        if low <= rounded <= high:
            rungs.add(rounded)
        batch *= factor
    return sorted(rungs)


class ProbingGoodputPolicy(GoodputPolicy):
    """Hill-climbs the measured progress rate over a ladder of batches B0 x factor^j.

    The progress rate of a batch B is AdaScale's gain per second, r(B) / T(B) (base-batch
    steps per second: Pollux's goodput / B0, see `GoodputPolicy`). Here both factors are
    *measured at B*: r(B) is the gain of a step run at B (`StepStats.gain`, from the
    statistics of that batch) and T(B) the median of the timings of steps at B in the
    `ThroughputModel`'s window (the host feeds them, as for `GoodputPolicy`). The policy
    keeps a home batch b and, `interval` optimizer steps after its last decision, probes
    the rung s steps away on the ladder in its direction d (up at first; s = 1 at first):

    1. from a step at b it moves to the probe p = ladder[i(b) + d s] for one step;
    2. after that step it keeps r(p) and goes back to b (p's timing arrives after this
       decision);
    3. after the next step at b, with r(b) that step's gain,

           r(p) / T(p) > (1 + hysteresis) r(b) / T(b)   ->  b <- p, d kept, s <- 2 s,
           else                                          ->  b kept, d <- -d, s <- 1,

       and a move probes on at once (an exponential search: 1, 2, 4... rungs), a lost
       probe waits `interval` x 2^(lost probes in a row, at most 5) steps.

    The ladder is {min_batch_size, max_batch_size} and B0 x factor^j (j >= 0, B0 the
    `base_batch_size`) rounded to the nearest multiple of the batch unit within the
    bounds. A probe past an end of the ladder goes one rung the other way. A gain that
    is not finite neither starts a probe nor is kept by one; a rate that cannot be
    measured (no timing) is not better. Nothing is predicted for a batch that was not
    run: when the noise scale or the step time grows with the batch, the probe sees it.

    Args:
      throughput: the `ThroughputModel` the host feeds (its window holds the timings);
        default a new one.
      initial_batch_size, min_batch_size, max_batch_size: global batch sizes.
      base_batch_size: B0 (the AdaScale base, the ladder's root); default
        `initial_batch_size`.
      hysteresis: relative gain in rate needed to move, >= 0 (default 5 %, AdaptDL's).
      interval: optimizer steps from a lost probe to the next, >= 1, doubled for each
        further lost probe in a row (at most 32 x; default 50).
      factor: the ladder's ratio, an integer >= 2 (default 2).

    Example (pure noise, gain = S = B / 32; a step at B costs 1 s + B / 64 s, so doubling
    from 32 costs 1.5 s -> 2 s: the rate goes from 1 / 1.5 to 2 / 2, the probe wins):

    >>> model = ThroughputModel()
    >>> policy = ProbingGoodputPolicy(model, initial_batch_size=32, min_batch_size=32,
    ...                               max_batch_size=256)
    >>> policy.build(batch_unit=32)
    >>> def step(batch, n):
    ...     stats = StepStats.make(gain=batch / 32, grad_sqr=0.0, trace_sigma=1.0, step=n)
    ...     new = int(policy.next_batch_size(batch, stats))
    ...     model.observe(batch // 32, 1.0 + batch / 64)  # the host times the step
    ...     return new
    >>> [step(32, 1), step(64, 2), step(32, 3)]  # probe 64, back to 32, move to 64
    [64, 32, 64]
    >>> step(64, 4)  # a move probes on at once, two rungs up: 256 (rate 8 / 5)
    256

    References:
      Qiao, Choe, Subramanya, Neiswanger, Ho, Zhang, Ganger, Xing. Pollux: Co-adaptive
      Cluster Scheduling for Goodput-Optimized Deep Learning. OSDI 2021.
      Johnson, Agrawal, Gu, Guestrin. AdaScale SGD: A User-Friendly Algorithm for
      Distributed Training. ICML 2020.
    """

    def __init__(
        self,
        throughput: ThroughputModel | None = None,
        *,
        initial_batch_size: int,
        min_batch_size: int,
        max_batch_size: int,
        base_batch_size: int | None = None,
        hysteresis: float = 0.05,
        interval: int = 50,
        factor: int = 2,
    ) -> None:
        super().__init__(
            throughput,
            initial_batch_size=initial_batch_size,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            base_batch_size=base_batch_size,
            hysteresis=hysteresis,
        )
        self.interval = integer("interval", interval)
        factor = integer("factor", factor)
        if factor < 2:
            raise ValueError(
                f"Argument `factor` must be an integer >= 2. Received: factor={factor}"
            )
        self.factor = factor
        self.ladder: list[int] = []
        self._state_built = False

    def build(self, batch_unit: int) -> None:
        super().build(batch_unit)
        self.ladder = _ladder(
            self.min_batch_size, self.max_batch_size, self.base_batch_size, batch_unit, self.factor
        )
        if self._state_built:
            return
        agg = tf.VariableAggregation.ONLY_FIRST_REPLICA

        def var(value: tf.Tensor, name: str) -> tf.Variable:
            return tf.Variable(value, trainable=False, aggregation=agg, name=name)

        with self.name_scope:
            # 0: at home; 1: the probe step was just taken; 2: back home after it.
            self.phase = var(tf.constant(0, tf.int64), "phase")
            self.home = var(tf.constant(0, tf.int64), "home")
            self.probe = var(tf.constant(0, tf.int64), "probe")
            self.probe_gain = var(tf.constant(0.0, _F64), "probe_gain")
            self.direction = var(tf.constant(1, tf.int64), "direction")
            self.stride = var(tf.constant(1, tf.int64), "stride")
            # The wait before the next probe is interval x backoff: x2 per lost probe in a
            # row (up to x32), x1 after a move.
            self.backoff = var(tf.constant(1, tf.int64), "backoff")
            # The first probe is due at the first step.
            self.last_decision = var(tf.constant(-self.interval, tf.int64), "last_decision")
        self._state_built = True

    def median_seconds(self, k: tf.Tensor) -> tf.Tensor:
        """Median timing of the steps with `k` micro-steps in the window (NaN if none;
        graph-safe)."""
        model = self.throughput
        used = tf.minimum(model.count, model.window)
        mine = (tf.range(model.window, dtype=tf.int64) < used) & tf.equal(
            model.timings_k, tf.cast(k, _F64)
        )
        values = tf.sort(tf.where(mine, model.timings_s, math.inf))
        n = tf.reduce_sum(tf.cast(mine, tf.int64))
        middle = 0.5 * (tf.gather(values, tf.maximum((n - 1) // 2, 0)) + tf.gather(values, n // 2))
        return tf.where(n > 0, middle, math.nan)

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        unit = self.batch_unit
        b = tf.cast(batch_size, tf.int64)
        step = tf.cast(stats.step, tf.int64)
        g = tf.cast(stats.gain, _F64)
        finite = tf.math.is_finite(g)
        ladder = tf.constant(self.ladder, tf.int64)
        top = len(self.ladder) - 1
        at = tf.clip_by_value(tf.reduce_sum(tf.cast(ladder <= b, tf.int64)) - 1, 0, top)
        ahead = tf.gather(ladder, tf.clip_by_value(at + self.direction * self.stride, 0, top))
        back = tf.gather(ladder, tf.clip_by_value(at - self.direction, 0, top))
        target = tf.where(tf.equal(ahead, b), back, ahead)

        phase, home, probe = (v.read_value() for v in (self.phase, self.home, self.probe))
        zero, one, two = (tf.constant(v, tf.int64) for v in (0, 1, 2))
        start = (
            tf.equal(phase, 0)
            & (step - self.last_decision >= self.interval * self.backoff)
            & finite
            & tf.not_equal(target, b)
        )
        returning = tf.equal(phase, 1)
        decide = tf.equal(phase, 2)
        rate_probe = self.probe_gain / self.median_seconds(probe // unit)
        rate_home = g / self.median_seconds(b // unit)
        better = decide & finite & (rate_probe > (1.0 + self.hysteresis) * rate_home)  # NaN: no

        new = tf.where(start, target, tf.where(returning, home, tf.where(better, probe, b)))
        # A probe whose gain is not finite is dropped: back home, no decision.
        next_phase = tf.where(start, one, tf.where(returning & finite, two, zero))
        self.phase.assign(next_phase)
        self.home.assign(tf.where(start, b, home))
        self.probe.assign(tf.where(start, target, probe))
        self.probe_gain.assign(tf.where(returning, g, self.probe_gain))
        sign = tf.sign(probe - b)
        self.direction.assign(
            tf.where(decide, tf.where(better, sign, -sign), self.direction.read_value())
        )
        # Exponential search: each move in a row doubles the stride, a lost probe resets it.
        self.stride.assign(
            tf.where(decide, tf.where(better, 2 * self.stride, one), self.stride.read_value())
        )
        self.backoff.assign(
            tf.where(decide, tf.where(better, one, tf.minimum(2 * self.backoff, 32)), self.backoff)
        )
        # A move probes on at once (the next rung may be better still); a lost probe waits.
        done = tf.where(better, step - self.interval, step)
        self.last_decision.assign(
            tf.where(decide | (returning & ~finite), done, self.last_decision)
        )
        return self._clamp(new)
