"""What one optimizer step may write, saved at its start so that a skipped step undoes it."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_adabatch import _keras_seams as seams
from tf_adabatch import stats as S

__all__ = ["StepRollback", "variable_bytes"]


class StepRollback:
    """What one optimizer step may write, saved at its start so that a skip undoes it.

    Two kinds of variables, saved two ways (called in cross-replica context, inside
    `tf.function`):
    - `local`: variables whose per-device copies may differ (BatchNormalization's
      moving statistics, which Keras updates per replica; seed generators; per-replica
      buffers). Each device's copy is copied into a backup beside it, created with the
      same synchronization so that `strategy.experimental_local_results` pairs their
      components: no cross-device traffic, no synchronisation point.
    - `mirrored`: variables kept identical on every device (trainable weights,
      optimizer slots). `save` copies the first device's copy into a backup on that
      device (one copy in all; the backup is allocated on every device, since a
      variable made under a strategy's scope is, but only the first is written);
      `restore_mirrored` assigns it back to every device, in a branch of the step
      taken only when an update from finite gradients was not finite.

    Example (the default strategy; a mirrored variable written, then rolled back):

    >>> w = tf.Variable([1.0, 2.0])
    >>> rollback = StepRollback(tf.distribute.get_strategy(), local=[], mirrored=[w],
    ...                         name="doc_backup")
    >>> rollback.save()
    >>> _ = w.assign([float("nan"), 0.0])
    >>> bool(rollback.all_finite())
    False
    >>> rollback.restore_mirrored()
    >>> w.numpy().tolist()
    [1.0, 2.0]
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        *,
        local: list[Any],
        mirrored: list[Any],
        name: str,
        copy_mirrored: bool = True,
    ) -> None:
        self._strategy, self._name = strategy, name
        self.local: list[Any] = []
        self._pairs: list[tuple[Any, Any]] = []
        self._checked: list[Any] = []  # per-device copies whose finiteness counts
        self.add_local(local)
        self.mirrored = [v for v in _unique(mirrored) if all(v is not w for w in self.local)]
        # (first device's copy, its backup there)
        self._mirrored_backups = [
            self._backup(v, f"mirrored_{i}", on_read=True)
            for i, v in enumerate(self.mirrored)
            if copy_mirrored
        ]
        self._mirrored_pairs = [
            (_first(strategy, v), _first(strategy, b))
            for v, b in zip(self.mirrored, self._mirrored_backups, strict=False)  # none: no copy
        ]
        self.copies_mirrored = copy_mirrored

    @classmethod
    def for_step(
        cls,
        strategy: tf.distribute.Strategy,
        model: Any,
        optimizer: Any,
        carried: list[Any],
        *,
        copy_mirrored: bool = True,
    ) -> StepRollback:
        """What one optimizer step may write: the model's non-trainable variables and
        the measurement's `carried` buffers (local), its weights and every optimizer
        variable (mirrored: checked for finiteness, and copied if `copy_mirrored`).

        The forward passes may write the model's non-trainable variables
        (BatchNormalization statistics, seed generators), and the apply may leave
        weights or slots non-finite (e.g. an infinite learning rate). The engine
        restores the local copies on every skip, the mirrored ones only when the
        *update* was not finite (on a non-finite gradient a loss-scale optimizer lowers
        its scale, which must stick)."""
        trainable = {id(seams.tf_variable(v)) for v in model.trainable_variables}
        chain = seams.optimizer_chain(optimizer)
        return cls(
            strategy,
            local=[
                *(v for v in model.variables if id(seams.tf_variable(v)) not in trainable),
                *carried,
            ],
            mirrored=[*model.trainable_variables, *(v for opt in chain for v in opt.variables)],
            name="adabatch_backup",
            copy_mirrored=copy_mirrored,
        )

    def backups(self) -> list[Any]:
        """The copies this roll-back holds (every device's component of each)."""
        mirrored = self._mirrored_backups
        return [copy for _, copy in self._pairs] + [
            v for b in mirrored for v in self._strategy.experimental_local_results(b)
        ]

    def _backup(self, variable: Any, suffix: str, *, on_read: bool) -> Any:
        """A zero variable shaped like `variable`, made in the strategy's scope: with its
        synchronization (one copy per device to pair with its copies), or `on_read`
        (per-device copies that may differ; only the first is used)."""
        if on_read:
            sync = {
                "synchronization": tf.VariableSynchronization.ON_READ,
                "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA,
            }
        else:
            sync = {
                "synchronization": variable.synchronization,
                "aggregation": variable.aggregation,
            }
        with self._strategy.scope():
            return tf.Variable(
                tf.zeros(variable.shape, variable.dtype),
                name=f"{self._name}_{suffix}",
                trainable=False,
                **sync,
            )

    def add_local(self, variables: list[Any], *, check_finite: bool = True) -> None:
        """Saves these too from now on (host code, before the step is traced)."""
        for tv in _unique(variables):
            if any(tv is v for v in self.local):
                continue
            backup = self._backup(tv, str(len(self.local)), on_read=False)
            sources = self._strategy.experimental_local_results(tv)
            copies = self._strategy.experimental_local_results(backup)
            if len(sources) != len(copies):
                # Not one copy per device (e.g. a metric variable made outside the
                # strategy's scope): no per-device pairing, so not guarded.
                continue
            self.local.append(tv)
            self._pairs.extend(zip(sources, copies, strict=True))
            if check_finite:
                self._checked.extend(sources)

    def save(self) -> None:
        """Copies what the step may write (cross-replica context, at the step's start)."""
        for source, copy in [*self._pairs, *self._mirrored_pairs]:
            copy.assign(source.read_value(), read_value=False)

    def restore_local(self) -> None:
        for source, copy in self._pairs:
            source.assign(copy.read_value(), read_value=False)

    def restore_mirrored(self) -> None:
        """Assigns the saved weights and slots back to every device (cross-replica);
        nothing without `copy_mirrored`."""
        for variable, (_, copy) in zip(self.mirrored, self._mirrored_pairs, strict=False):
            variable.assign(copy.read_value(), read_value=False)

    def all_finite(self) -> tf.Tensor:
        """Whether every floating-point variable checked holds only finite values (every
        copy of the local ones, the first copy of the mirrored ones; not the metrics').

        A sum is finite exactly when its terms are, unless it overflows: each variable
        is summed (one fused pass, no boolean copy of it; 16-bit ones in float32) and
        the sums of each device are added in their dtype, so that one scalar per device
        and dtype is tested. A float32 variable whose elements sum beyond 3.4e38 (a
        model whose weights have already diverged) counts as non-finite.
        """
        groups: dict[tuple[str, Any], list[tf.Tensor]] = {}
        for v in self._checked + self.mirrored:
            if not v.dtype.is_floating:
                continue
            with tf.device(v.device):
                total = tf.reduce_sum(S.promote_to_float32(v.read_value()))
            groups.setdefault((v.device, total.dtype), []).append(total)
        checks = []
        for (device, _), sums in groups.items():
            with tf.device(device):
                checks.append(tf.math.is_finite(tf.add_n(sums)))
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def variable_bytes(strategy: tf.distribute.Strategy, variables: list[Any]) -> int:
    """Bytes of `variables` on all devices together, each device's component once.

    >>> variable_bytes(tf.distribute.get_strategy(), [tf.Variable(tf.zeros([3, 2]))])
    24
    """
    seen: dict[int, int] = {}
    for variable in variables:
        for part in strategy.experimental_local_results(seams.tf_variable(variable)):
            seen[id(part)] = part.shape.num_elements() * part.dtype.size
    return sum(seen.values())


def _first(strategy: tf.distribute.Strategy, variable: Any) -> Any:
    """The first local device's copy of a (possibly distributed) variable."""
    return strategy.experimental_local_results(variable)[0]


def _unique(variables: list[Any]) -> list[Any]:
    unique: dict[int, Any] = {}
    for v in variables:
        tv = seams.tf_variable(v)
        unique.setdefault(id(tv), tv)
    return list(unique.values())
