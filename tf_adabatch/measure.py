"""How one optimizer step measures its gradient groups: one class per similarity mode.

A measurement owns its per-replica buffers and does three things:

    accumulate (replica context)       add one micro-step's gradient and its float64
                                        scalars [|g|^2, loss, 1] to this replica's
                                        accumulators
    reduce (replica context)           all-reduce this replica's sums once; returns the
                                        mean gradient gbar and a typed `Reading`
    interpret (cross-replica context)  this step's own noise moments (unclipped), whether
                                        they may enter the moving averages, and the
                                        groups' similarity

The three modes:

- `ExactGroups` (similarity "exact"): the two groups' gradients. Micro-gradient i of
  replica r belongs to group A iff (i*N + r) is even; one all-reduce of [A+B, A-B]
  gives the applied total and the cosine. With an odd N (1 included) a replica's
  micro-steps fall into both groups: two accumulators. One replica needs k >= 2.
- `ScalarMoments` (similarity "estimated", N >= 2): one all-reduce of the total, and two
  more scalars per replica (its gradient's norm and squared norm): the similarity is the
  replicas' pairwise cosine carried to half-batches (with N = 2 exact mode's cosine).
- `DifferencedSingleReplica` (similarity "estimated", N = 1): the expected cosine of two
  half-batches from the step's moments; with one micro-gradient (k = 1) the moments come
  from the difference with the previous step's gradient, which it keeps (and which
  checkpoints carry).

`make_measurement` picks the class. The engine (`tf_adabatch.engine`) orchestrates:
micro-loop, reduce, statistics, apply, policy.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tf_adabatch import stats as S

__all__ = [
    "SCOPES",
    "DifferencedSingleReplica",
    "ExactGroups",
    "GroupMeasurement",
    "Interpretation",
    "Reading",
    "ScalarMoments",
    "all_reduce_with_scalars",
    "join_float64",
    "make_measurement",
    "min_accumulation_steps",
    "split_float64",
]

# Name scopes of the parts of one optimizer step, so that a profile (TensorBoard's trace
# viewer, launch/profile_step.py) attributes every op to its part. They cost nothing at
# run time.
SCOPES = {
    "micro": "adabatch_micro_step",
    "accumulate": "adabatch_accumulate",
    "grad_allreduce": "adabatch_grad_allreduce",
    "scalar_allreduce": "adabatch_scalar_allreduce",
    "statistics": "adabatch_statistics",
    "apply": "adabatch_apply",
    "rollback": "adabatch_rollback",
    "policy": "adabatch_policy",
}
_F64 = tf.float64
_ON_READ = {
    "synchronization": tf.VariableSynchronization.ON_READ,
    "aggregation": tf.VariableAggregation.SUM,
    "trainable": False,
}


class Reading(NamedTuple):
    """What one step's all-reduce measured (float64 scalars, identical on every replica).

    Attributes:
      num_micro: n, the micro-gradients all-reduced.
      mean_sq: mean over them of |g_i|^2.
      loss: their mean data loss.
      grad_mean_sq: |gbar|^2.
      extra: the mode's own terms: exact (g_A.g_B, |g_A|^2, |g_B|^2) of the two groups'
        sums; estimated on N >= 2 replicas (sum_r |h_r|^2, sum_r |h_r|) of the replicas'
        gradient sums h_r; differenced (gbar.g_prev, |gbar - g_prev|^2); otherwise empty.

    >>> Reading(num_micro=4.0, mean_sq=2.0, loss=0.5, grad_mean_sq=1.0).extra
    ()
    """

    num_micro: tf.Tensor
    mean_sq: tf.Tensor
    loss: tf.Tensor
    grad_mean_sq: tf.Tensor
    extra: tuple[tf.Tensor, ...] = ()


class Interpretation(NamedTuple):
    """A reading turned into statistics (cross-replica context).

    Attributes:
      moments: this step's own |G|^2 and tr(Sigma) estimates, unclipped.
      valid: whether they may enter the moving averages.
      similarity: the groups' similarity of this step.

    >>> Interpretation(S.NoiseMoments(1.0, 8.0), True, 0.5).moments.trace_sigma
    8.0
    """

    moments: S.NoiseMoments
    valid: tf.Tensor
    similarity: tf.Tensor


def _set_or_add(slot: list[tf.Variable], values: list[tf.Tensor], overwrite: tf.Tensor) -> None:
    """slot = values if `overwrite` else slot + values (one `tf.cond`, replica-local)."""

    def assign() -> None:
        for var, value in zip(slot, values, strict=True):
            var.assign(value)

    def add() -> None:
        for var, value in zip(slot, values, strict=True):
            var.assign_add(value)

    tf.cond(overwrite, assign, add)


def micro_scalars(grads: list[tf.Tensor], data_loss: tf.Tensor) -> tf.Tensor:
    """[|g|^2, loss, 1] of one micro-step, float64 (the accumulated scalars)."""
    return tf.stack([S.sum_of_squares(grads), tf.cast(data_loss, _F64), tf.constant(1.0, _F64)])


def _zeros_like(v: Any, prefix: str) -> tf.Variable:
    name = f"{prefix}/{v.path}".replace(":", "_") if hasattr(v, "path") else prefix
    return tf.Variable(tf.zeros(v.shape, dtype=v.dtype), name=name, **_ON_READ)


def _replica_id() -> tf.Tensor:
    return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)


# The float64 scalars travel in the gradient all-reduce as float32 limbs (below).
_LIMBS = 3
_LIMB_BITS = 8
# Veltkamp's splitting constant for a head of _LIMB_BITS of float64's 53 bits.
_SPLITTER = float(2 ** (53 - _LIMB_BITS) + 1)


def split_float64(x: tf.Tensor) -> tf.Tensor:
    """A float64 vector as float32 limbs that can be summed over replicas in float32.

    Each value x becomes three float32 numbers [h, m, l] with h + m + l = x: h holds
    x's 8 leading bits, m the next 8 of the rest, l the float32 rounding of what is
    left (the limbs of all values: first all h, then all m, then all l). A float32 sum of
    N replicas' h limbs is exact while their magnitudes are within 2**(15 - log2 N) of
    each other (8 bits each plus the carries fit float32's 24), likewise the m limbs;
    the l limbs carry about 2**-16 of the value, so their float32 rounding costs about
    2**-40 of it. The sum of the limbs' sums is then the float64 sum to about 1e-12 for
    values of similar size and to 1e-10 while they are within a factor of
    2**(15 - log2 N) of each other (2**12 for 8 replicas), where a plain float32 sum
    keeps 2**-24 (6e-8); a wider spread degrades to float32's precision, never below it
    (tests/test_scalar_transport.py measures all three). Values beyond
    float32's range (above 3.4e38) become inf, and non-finite values stay non-finite
    (inf may come back as NaN).

    >>> x = tf.constant([1.0 / 3.0, 0.0, -2.0**60 / 7.0], tf.float64)
    >>> limbs = split_float64(x)
    >>> limbs.dtype.name, limbs.shape.as_list()
    ('float32', [9])
    >>> bool(tf.reduce_all(tf.abs(join_float64(limbs) - x) <= 2.0**-40 * tf.abs(x)))
    True
    """
    rest = tf.convert_to_tensor(x, _F64)
    limbs = []
    for _ in range(_LIMBS - 1):
        # Veltkamp's split: `head` is `rest` rounded to its _LIMB_BITS leading bits and
        # rest - head is exact (three float64 operations, no bit manipulation).
        scaled = rest * _SPLITTER
        head = scaled - (scaled - rest)
        limbs.append(head)
        rest -= head
    limbs.append(rest)
    return tf.cast(tf.concat(limbs, 0), tf.float32)


def join_float64(limbs: tf.Tensor) -> tf.Tensor:
    """The float64 values of `split_float64`'s limbs (or of their sums over replicas).

    >>> abs(float(join_float64(split_float64(tf.constant([0.1], tf.float64)))[0]) - 0.1) < 1e-13
    True
    """
    parts = tf.split(tf.cast(limbs, _F64), _LIMBS)
    return parts[0] + (parts[1] + parts[2])


def all_reduce_with_scalars(
    ctx: Any, tensors: list[tf.Tensor], scalars: tf.Tensor
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Sums `tensors` and the float64 vector `scalars` over replicas in ONE all-reduce.

    Replica context. A second, scalar all-reduce would cost a collective's fixed time
    (0.2-0.3 ms per step measured with 2 and 4 CPU replicas, a few percent of a small
    model's step), so the scalars join the gradients' all-reduce, which tf.distribute
    packs into one collective. The collective takes one dtype: with float32 gradients the
    scalars travel as `split_float64` limbs (near float64 precision, see there); with float64
    gradients as they are. Gradients of other or mixed dtypes, and a single replica (no
    communication), keep a separate float64 all-reduce.

    Returns:
      (the tensors' sums, the scalars' sums as float64).

    Example (the default strategy's single replica: the sums are the values):

    >>> ctx = tf.distribute.get_replica_context()
    >>> total, sums = all_reduce_with_scalars(
    ...     ctx, [tf.ones(2)], tf.constant([0.1, 3.0], tf.float64))
    >>> total[0].numpy().tolist(), sums.numpy().tolist()
    ([1.0, 1.0], [0.1, 3.0])
    """
    dtypes = {t.dtype for t in tensors}
    sum_op = tf.distribute.ReduceOp.SUM
    if ctx.num_replicas_in_sync == 1 or dtypes not in ({tf.float32}, {_F64}):
        with tf.name_scope(SCOPES["grad_allreduce"]):
            reduced = ctx.all_reduce(sum_op, tensors)
        with tf.name_scope(SCOPES["scalar_allreduce"]):
            return reduced, ctx.all_reduce(sum_op, scalars)
    packed = scalars if dtypes == {_F64} else split_float64(scalars)
    with tf.name_scope(SCOPES["grad_allreduce"]):
        reduced = ctx.all_reduce(sum_op, [*tensors, packed])
    summed = reduced.pop()
    return reduced, (summed if dtypes == {_F64} else join_float64(summed))


class GroupMeasurement:
    """Base: one accumulator per variable, the total all-reduced, scalar moments.

    Create it inside the strategy's scope (it makes per-replica variables).

    Attributes:
      min_accumulation_steps: the smallest k the mode can measure with.
      fuses_last_micro_step: whether the engine may hand the last micro-step's gradient
        straight to `reduce` instead of accumulating it first.

    >>> GroupMeasurement.mode, GroupMeasurement.min_accumulation_steps
    ('estimated', 1)
    """

    mode = "estimated"
    min_accumulation_steps = 1
    fuses_last_micro_step = True
    uses_replica_norms = False
    # Set by the engine: leave the gradient-sized terms of the reading to `complete`,
    # once, in cross-replica context (N >= 2, not on TPUs, whose cross-replica code
    # runs on the host).
    norms_after_reduce = False

    def __init__(
        self, variables: list[Any], *, num_replicas: int, micro_batch_size: int, state: Any
    ) -> None:
        self.num_replicas = num_replicas
        self.micro_batch_size = micro_batch_size
        self.state = state  # the engine's `AdaptiveState` (k; the differenced batch)
        self.acc = [_zeros_like(v, "acc") for v in variables]
        # sum |g_i|^2, sum loss_i, count of micro-gradients: float64 per replica.
        self.scalars = tf.Variable(tf.zeros([3], _F64), name="acc_scalars", **_ON_READ)

    @property
    def carried_buffers(self) -> list[tf.Variable]:
        """Buffers the next step reads (to checkpoint, and to roll back on a skip)."""
        return []

    def variables(self) -> list[tf.Variable]:
        """Every variable this measurement holds (accumulators, buffers)."""
        return [
            v
            for value in vars(self).values()
            for v in (value if isinstance(value, list) else [value])
            if isinstance(v, tf.Variable)
        ]

    # ------------------------------------------------------------ replica context

    def accumulate(
        self, grads: list[tf.Tensor], data_loss: tf.Tensor, micro_index: tf.Tensor
    ) -> None:
        """Adds one micro-step's gradients and scalars to this replica's accumulators."""
        # The first micro-step of an optimizer step overwrites the accumulators, so no
        # reset pass is needed (and a step cut short by the end of the data is simply
        # overwritten by the next one).
        first = micro_index == 0
        self._accumulate_gradients(grads, micro_index)
        _set_or_add([self.scalars], [micro_scalars(grads, data_loss)], first)

    def _accumulate_gradients(self, grads: list[tf.Tensor], micro_index: tf.Tensor) -> None:
        _set_or_add(self.acc, grads, micro_index == 0)

    def reduce_with_last(
        self, grads: list[tf.Tensor], data_loss: tf.Tensor, micro_index: tf.Tensor
    ) -> tuple[Reading, list[tf.Tensor], tuple[list[tf.Tensor], ...]]:
        """`reduce`, with the step's last micro-step's gradients added to the
        accumulators' sums of the earlier ones (none when it is the first), without
        being written to the accumulators and read back (`fuses_last_micro_step`)."""
        with tf.name_scope(SCOPES["accumulate"]):
            scalars = micro_scalars(grads, data_loss)
            earlier = micro_index > 0

            def with_earlier() -> tuple[list[tf.Tensor], tf.Tensor]:
                local = [g + a.read_value() for g, a in zip(grads, self.acc, strict=True)]
                return local, scalars + self.scalars.read_value()

            local, local_scalars = tf.cond(earlier, with_earlier, lambda: (list(grads), scalars))
            local_sq = None  # |h_r|^2, for a measurement with replica norms
            if self.uses_replica_norms:
                # Alone, the last micro-step's |g|^2 (in `scalars`) is |h_r|^2. A branch
                # of its own: inside the one above, the sum of squares made every step
                # 0.4 ms slower with k = 1 (2 replicas, measured), though never run.
                local_sq = tf.cond(earlier, lambda: S.sum_of_squares(local), lambda: scalars[0])
        return self.reduce(local, local_scalars, local_sq)

    def reduce(
        self,
        local: list[tf.Tensor] | None = None,
        local_scalars: tf.Tensor | None = None,
        local_sq: tf.Tensor | None = None,
    ) -> tuple[Reading, list[tf.Tensor], tuple[list[tf.Tensor], ...]]:
        """All-reduces this replica's sums (default: the accumulators').

        `local_sq`: |sum of this replica's micro-gradients|^2 if the caller has it
        (a measurement with `uses_replica_norms` needs it; computed if not given).

        Returns:
          (reading, gbar, pending). With `norms_after_reduce` set, the reading's
          gradient-sized terms (|gbar|^2; exact mode's group products) are left to
          `complete` in cross-replica context, from `pending` (the all-reduced tensors
          they need); otherwise they are computed here and `pending` is empty.
        """
        ctx = tf.distribute.get_replica_context()
        if local is None:
            local = [a.read_value() for a in self.acc]
        if local_scalars is None:
            local_scalars = self.scalars.read_value()
        if self.uses_replica_norms:
            if local_sq is None:
                local_sq = S.sum_of_squares(local)
            # [|h_r|^2, |h_r|] of this replica: summed over replicas with the others.
            local_scalars = tf.concat([local_scalars, [local_sq, tf.sqrt(local_sq)]], 0)
        total, pending, scalars = self._all_reduce_gradients(ctx, local, local_scalars)
        n = scalars[2]
        # One multiplication per element (a division costs several times more).
        gbar = [t * tf.cast(1.0 / n, t.dtype) for t in total]
        extra = (scalars[3], scalars[4]) if self.uses_replica_norms else ()
        reading = Reading(n, scalars[0] / n, scalars[1] / n, tf.constant(float("nan"), _F64), extra)
        pending = (gbar, *pending)
        if self.norms_after_reduce:
            return reading, gbar, pending
        return self._after_reduce(self.complete(reading, pending), gbar), gbar, ()

    def complete(self, reading: Reading, pending: tuple[list[tf.Tensor], ...]) -> Reading:
        """The reading's gradient-sized terms, from `reduce`'s pending tensors.

        Called by `reduce` itself, or, with `norms_after_reduce`, once in cross-replica
        context on the first replica's tensors: the all-reduced tensors are the same on
        every replica, so there is no need for each replica to reduce them again (with
        N replicas sharing a CPU that is N - 1 passes over the gradient saved).
        """
        gbar = pending[0]
        with tf.device(gbar[0].device):
            return reading._replace(grad_mean_sq=S.sum_of_squares(gbar))

    def _all_reduce_gradients(
        self, ctx: Any, local: list[tf.Tensor], scalars: tf.Tensor
    ) -> tuple[list[tf.Tensor], tuple[list[tf.Tensor], ...], tf.Tensor]:
        """(total, tensors `complete` needs besides gbar, the scalars' sums), one all-reduce."""
        total, scalars = all_reduce_with_scalars(ctx, local, scalars)
        return total, (), scalars

    def _after_reduce(self, reading: Reading, gbar: list[tf.Tensor]) -> Reading:
        return reading

    # ------------------------------------------------------ cross-replica context

    def interpret(self, reading: Reading, batch: tf.Tensor, finite: tf.Tensor) -> Interpretation:
        """This step's moments, their validity and the similarity."""
        moments = S.step_moments(
            reading.mean_sq, reading.grad_mean_sq, reading.num_micro, self.micro_batch_size
        )
        return self._interpret(reading, moments, reading.num_micro >= 2.0, batch, finite)

    def _interpret(
        self,
        reading: Reading,
        moments: S.NoiseMoments,
        valid: tf.Tensor,
        batch: tf.Tensor,
        finite: tf.Tensor,
    ) -> Interpretation:
        return Interpretation(moments, valid, self._similarity(reading, moments, batch))

    def after_step(self, applied: tf.Tensor, batch: tf.Tensor) -> None:
        """Writes what the next step reads of this one, if it was applied (cross-replica
        context; after the roll-back). Nothing here; the differenced estimator's batch."""
        del applied, batch

    def _similarity(self, reading: Reading, moments: S.NoiseMoments, batch: tf.Tensor) -> tf.Tensor:
        """The step's similarity (each mode its own reading; none has a memory)."""
        # This step's own moments (unclipped): like exact mode's per-step cosine it has
        # no memory, so the batch follows a change of the noise at once instead of
        # lagging behind the gain's long moving averages.
        similarity = S.estimated_similarity(moments.grad_sqr, moments.trace_sigma, batch)
        return similarity


class ScalarMoments(GroupMeasurement):
    """Estimated similarity on N >= 2 replicas: the total all-reduced, no group terms.

    Each replica adds two scalars to the scalar all-reduce, the squared norm and the
    norm of its own gradient sum h_r; with |total|^2 they give the replicas' pairwise
    cosine (`stats.replica_similarity`), exactly exact mode's cosine when N = 2. The
    moments (and so the gain) are those of `GroupMeasurement`.

    >>> ScalarMoments.mode, ScalarMoments.min_accumulation_steps, ScalarMoments.uses_replica_norms
    ('estimated', 1, True)
    """

    uses_replica_norms = True

    def _similarity(self, reading: Reading, moments: S.NoiseMoments, batch: tf.Tensor) -> tf.Tensor:
        # The step's own replica norms.
        sum_sq, sum_norm = reading.extra
        total_sq = reading.grad_mean_sq * tf.square(reading.num_micro)  # |sum_r h_r|^2
        return S.replica_similarity(total_sq, sum_sq, sum_norm, self.num_replicas)


class DifferencedSingleReplica(GroupMeasurement):
    """Estimated similarity on one replica, from the moments (`stats.estimated_similarity`).

    With k >= 2 micro-gradients the step's own moments; with k = 1 the moments from the difference between this step's gradient
    and the previous one's (`stats.differenced_moments`), kept in `prev`.

    >>> DifferencedSingleReplica.fuses_last_micro_step
    True
    """

    def __init__(self, variables: list[Any], **kwargs: Any) -> None:
        super().__init__(variables, **kwargs)
        self.prev = [_zeros_like(v, "prev_grad") for v in variables]

    @property
    def carried_buffers(self) -> list[tf.Variable]:
        return list(self.prev)

    def _after_reduce(self, reading: Reading, gbar: list[tf.Tensor]) -> Reading:
        dot_prev = S.dot(gbar, [p.read_value() for p in self.prev])
        diff_sq = S.sum_of_squares(
            [g - p.read_value() for g, p in zip(gbar, self.prev, strict=True)]
        )
        finite = tf.math.is_finite(reading.grad_mean_sq) & tf.math.is_finite(reading.mean_sq)
        for p, g in zip(self.prev, gbar, strict=True):
            p.assign(tf.where(finite, g, p.read_value()))
        return reading._replace(extra=(dot_prev, diff_sq))

    def _interpret(
        self,
        reading: Reading,
        moments: S.NoiseMoments,
        valid: tf.Tensor,
        batch: tf.Tensor,
        finite: tf.Tensor,
    ) -> Interpretation:
        state = self.state
        dot_prev, diff_sq = reading.extra
        diff = S.differenced_moments(dot_prev, diff_sq, batch, state.prev_batch_size)
        has_prev = state.prev_batch_size > 0.0
        moments = S.NoiseMoments(
            *(tf.where(valid, w, d) for w, d in zip(moments, diff, strict=True))
        )
        valid = valid | has_prev
        return super()._interpret(reading, moments, valid, batch, finite)

    def after_step(self, applied: tf.Tensor, batch: tf.Tensor) -> None:
        # `prev` holds this step's gradient (the roll-back restores it on a skip).
        state = self.state
        state.prev_batch_size.assign(
            tf.where(applied, batch, state.prev_batch_size), read_value=False
        )


class ExactGroups(GroupMeasurement):
    """Exact similarity: the cosine of the two groups' mean gradients.

    Group A holds micro-gradient i of replica r iff (i*N + r) is even. With an even N a
    replica's micro-steps all fall into one group (a sign flip suffices); with an odd N
    (one replica included) they fall into both: a second accumulator (`acc_odd`), and
    the last micro-step is accumulated like the others before the reduce.

    >>> ExactGroups.mode
    'exact'
    """

    mode = "exact"

    def __init__(self, variables: list[Any], **kwargs: Any) -> None:
        super().__init__(variables, **kwargs)
        self.two_slots = self.num_replicas % 2 == 1
        self.acc_odd = [_zeros_like(v, "acc_odd") for v in variables] if self.two_slots else []
        self.min_accumulation_steps = min_accumulation_steps("exact", self.num_replicas)
        self.fuses_last_micro_step = not self.two_slots

    def _accumulate_gradients(self, grads: list[tf.Tensor], micro_index: tf.Tensor) -> None:
        if not self.two_slots:
            super()._accumulate_gradients(grads, micro_index)
            return
        # Odd N: micro-step i of replica r goes to slot (i*N + r) mod 2; each slot's
        # first micro-step is i = 0 or i = 1.
        odd = tf.math.floormod(
            tf.cast(micro_index, tf.int64) * self.num_replicas + _replica_id(), 2
        )
        tf.cond(
            odd == 1,
            lambda: _set_or_add(self.acc_odd, grads, micro_index < 2),
            lambda: _set_or_add(self.acc, grads, micro_index < 2),
        )

    def _all_reduce_gradients(
        self, ctx: Any, local: list[tf.Tensor], scalars: tf.Tensor
    ) -> tuple[list[tf.Tensor], tuple[list[tf.Tensor], ...], tf.Tensor]:
        # One all-reduce of [A + B, A - B] (A, B: this replica's part of the two groups'
        # sums) yields the total T = sum_A + sum_B that is applied and the difference
        # D = sum_A - sum_B; the three inner products of the groups follow from |T|^2,
        # |D|^2 and T.D (and |T|^2 is needed anyway).
        replica = _replica_id()
        if self.two_slots:
            # With k = 1 a replica writes only its own slot (r mod 2); the other one
            # holds an earlier step's values.
            k = self.state.accumulation_steps
            even_ok = (k >= 2) | (tf.math.floormod(replica, 2) == 0)
            odd_ok = (k >= 2) | (tf.math.floormod(replica, 2) == 1)
            sums, diffs = [], []
            for a, b in zip(local, self.acc_odd, strict=True):
                even = tf.where(even_ok, a, tf.zeros_like(a))
                odd = tf.where(odd_ok, b.read_value(), tf.zeros_like(a))
                sums.append(even + odd)
                diffs.append(even - odd)
        else:
            odd_replica = tf.math.floormod(replica, 2) == 1
            sums = local
            diffs = [a * tf.cast(tf.where(odd_replica, -1.0, 1.0), a.dtype) for a in local]
        # One all-reduce call of the 2L tensors and the scalars (no stacking):
        # tf.distribute packs them into one collective, as it does the L tensors in
        # estimated mode.
        reduced, scalars = all_reduce_with_scalars(ctx, sums + diffs, scalars)
        total, diff = reduced[: len(local)], reduced[len(local) :]
        return total, (total, diff), scalars

    def complete(self, reading: Reading, pending: tuple[list[tf.Tensor], ...]) -> Reading:
        _, total, diff = pending
        with tf.device(total[0].device):
            total_sq = S.sum_of_squares(total)
            diff_sq = S.sum_of_squares(diff)
            cross = S.dot(total, diff)
        # cos(sum_A, sum_B) = cos(mean_A, mean_B): the groups' sizes do not matter.
        dot_ab = (total_sq - diff_sq) / 4.0
        sq_a = (total_sq + 2.0 * cross + diff_sq) / 4.0
        sq_b = (total_sq - 2.0 * cross + diff_sq) / 4.0
        grad_mean_sq = total_sq / tf.square(tf.cast(reading.num_micro, _F64))
        return reading._replace(grad_mean_sq=grad_mean_sq, extra=(dot_ab, sq_a, sq_b))

    def _similarity(self, reading: Reading, moments: S.NoiseMoments, batch: tf.Tensor) -> tf.Tensor:
        return S.cosine_similarity(*reading.extra)


def min_accumulation_steps(mode: str, num_replicas: int) -> int:
    """The smallest k a mode can measure with: 2 for exact similarity on one replica
    (two groups from its micro-steps), else 1.

    >>> min_accumulation_steps("exact", 1), min_accumulation_steps("exact", 3)
    (2, 1)
    """
    return 2 if (mode == "exact" and num_replicas == 1) else 1


def make_measurement(
    mode: str,
    variables: list[Any],
    *,
    num_replicas: int,
    micro_batch_size: int,
    state: Any,
    strategy: Any = None,
) -> GroupMeasurement:
    """The measurement of a similarity mode ("exact" or "estimated") on N replicas.

    Create it inside the strategy's scope. With N >= 2 replicas the reading's
    gradient-sized terms are computed once, on the first replica's all-reduced tensors
    (`norms_after_reduce`), not by every replica; on a TPU (`strategy`) the
    cross-replica code runs on the host, so there each replica keeps computing them.

    >>> import keras
    >>> v = [keras.Variable(np.zeros(3, np.float32))]
    >>> from tf_adabatch.state import AdaptiveState
    >>> m = make_measurement("estimated", v, num_replicas=1, micro_batch_size=4,
    ...                      state=AdaptiveState())
    >>> type(m).__name__, len(m.carried_buffers)
    ('DifferencedSingleReplica', 1)
    """
    kwargs = dict(num_replicas=num_replicas, micro_batch_size=micro_batch_size, state=state)
    kind: type[GroupMeasurement] = ScalarMoments
    if mode == "exact":
        kind = ExactGroups
    elif mode != "estimated":
        raise ValueError(f"Argument `mode` must be 'exact' or 'estimated'. Received: mode={mode!r}")
    elif num_replicas == 1:
        kind = DifferencedSingleReplica
    measurement = kind(variables, **kwargs)
    tpu = tuple(
        module.TPUStrategy
        for module in (tf.distribute, tf.distribute.experimental)
        if hasattr(module, "TPUStrategy")
    )
    measurement.norms_after_reduce = num_replicas >= 2 and not isinstance(strategy, tpu)
    return measurement
