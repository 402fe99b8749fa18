"""`Trainer.evaluate`: the loss and Keras metrics over a finite dataset, under any strategy."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_adabatch import _keras_seams as seams
from tf_adabatch.engine import AdaptiveEngine

__all__ = ["Evaluation"]


class Evaluation:
    """Evaluates an engine's model with its loss, as `model.evaluate` computes them.

    One traced evaluation step is kept per `metrics` / `weighted_metrics` argument
    (reused while they are the same objects or names). `Trainer.evaluate` documents
    the arguments and the result, and calls one.

    >>> import tf_adabatch
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> engine = tf_adabatch.AdaptiveEngine(model, loss="mse",
    ...                                     optimizer=keras.optimizers.SGD(0.1), micro_batch_size=4)
    >>> x = np.zeros((6, 2), "float32")
    >>> Evaluation(engine)(tf.data.Dataset.from_tensor_slices((x, np.ones(6))).batch(4))
    {'loss': 1.0}
    """

    def __init__(self, engine: AdaptiveEngine) -> None:
        self._engine = engine
        self._eval_fn: Any = None
        self._eval_key: Any = None

    def __call__(
        self, dataset: Any, *, metrics: Any = None, weighted_metrics: Any = None
    ) -> dict[str, float]:
        """The loss and metrics over `dataset` (see `Trainer.evaluate`)."""
        engine = self._engine
        strategy = engine.strategy
        model = engine.model
        if isinstance(dataset, tf.data.Dataset):
            dist = strategy.experimental_distribute_dataset(dataset)
        elif callable(dataset):
            dist = strategy.distribute_datasets_from_function(dataset)
        else:
            raise ValueError(
                "Argument `dataset` must be a finite `tf.data.Dataset` of global batches or "
                "a function `input_context -> tf.data.Dataset`. Received: dataset of type "
                f"{type(dataset).__name__}"
            )
        iterator = iter(dist)
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            raise ValueError("Argument `dataset` must not be empty.")
        first = optional.get_value()
        key = _metrics_key("metrics", metrics) + _metrics_key("weighted", weighted_metrics)
        if self._eval_fn is None or self._eval_key != key:
            local = tf.nest.map_structure(
                lambda v: (
                    strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues)
                    else v
                ),
                first,
            )
            x, y, _ = keras.utils.unpack_x_y_sample_weight(local)
            y_pred = model.compute_output_spec(
                tf.nest.map_structure(lambda t: keras.KerasTensor(t.shape, t.dtype.name), x)
            )
            with strategy.scope():
                tracker = keras.metrics.Mean(name="loss")
                entries = [
                    *_resolve_metrics("metrics", metrics, y, y_pred, strategy, weighted=False),
                    *_resolve_metrics(
                        "weighted_metrics", weighted_metrics, y, y_pred, strategy, weighted=True
                    ),
                ]
            loss_obj = seams.reducing_loss(engine._grads.loss_fn)

            def replica_step(data: Any) -> None:
                x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
                y_pred = model(x, training=False)
                # Keras's test step: the Loss reduces per replica and divides by the
                # replica count; undo that, add the model's losses, weight by the batch.
                loss = seams.undo_replica_scaling(
                    tf.cast(loss_obj(y, y_pred, sample_weight=sample_weight), tf.float32)
                )
                for extra in model.losses:
                    loss = loss + tf.cast(extra, tf.float32)
                batch = tf.shape(next(v for v in tf.nest.flatten(x) if v is not None))[0]
                # A replica may get no example (a global batch smaller than the replicas,
                # or the last one's remainder): its loss is then an empty tensor, whose
                # mean in the tracker is NaN and spoils the sum of the replicas. It adds
                # nothing instead (a scalar 0 of weight 0).
                loss = tf.where(batch > 0, tf.reduce_mean(loss), 0.0)
                tracker.update_state(loss, sample_weight=batch)
                for _, metric, weighted in entries:
                    metric.update_state(
                        y, y_pred, sample_weight=sample_weight if weighted else None
                    )

            @tf.function(reduce_retracing=True)
            def eval_step(data: Any) -> None:
                strategy.run(replica_step, args=(data,))

            self._eval_fn = (eval_step, [("loss", tracker, False), *entries])
            self._eval_key = key
        eval_step, all_metrics = self._eval_fn
        for _, metric, _ in all_metrics:
            metric.reset_state()
        eval_step(first)
        while True:
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            eval_step(optional.get_value())
        results: dict[str, float] = {}
        for name, metric, _ in all_metrics:
            value = metric.result()  # cross-replica read: summed over the replicas
            if isinstance(value, dict):
                results.update({k: _to_float(v) for k, v in value.items()})
            else:
                results[name] = _to_float(value)
        return results


def _metrics_key(role: str, metrics: Any) -> list[tuple[str, str, int]]:
    """Identifies a `metrics` argument: the cached evaluation is reused while it matches."""
    if metrics is None:
        return []
    items = metrics.items() if isinstance(metrics, dict) else enumerate(_as_list(metrics))
    return [(role, str(name), id(m) if not isinstance(m, str) else hash(m)) for name, m in items]


def _as_list(metrics: Any) -> list[Any]:
    return list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]


def _resolve_metrics(
    argument: str,
    metrics: Any,
    y_true: Any,
    y_pred: Any,
    strategy: tf.distribute.Strategy,
    *,
    weighted: bool,
) -> list[tuple[str, keras.metrics.Metric, bool]]:
    """Keras metric objects for `Trainer.evaluate` (call in the strategy's scope)."""
    if metrics is None:
        return []
    named = (
        list(metrics.items())
        if isinstance(metrics, dict)
        else [(None, m) for m in _as_list(metrics)]
    )
    resolved = []
    for name, spec in named:
        if isinstance(spec, keras.losses.Loss):
            # Its per-example values, averaged over examples. (Keras's `compile` wraps
            # a Loss object's reduced value instead: a mean of batch means, divided by
            # the replica count under a strategy.)
            metric: keras.metrics.Metric = keras.metrics.MeanMetricWrapper(
                spec.call, name=name or spec.name
            )
        elif isinstance(spec, keras.metrics.Metric):
            metric = _in_scope(spec, strategy, argument)
        elif isinstance(spec, str) or callable(spec):
            metric = seams.resolve_metric(spec, y_true, y_pred)
        else:
            raise TypeError(
                f"Argument `{argument}` must hold metric names, `keras.metrics.Metric` or "
                "`keras.losses.Loss` objects or callables `(y_true, y_pred) -> values`, "
                f"in a list or a dict name -> metric. Received: {argument}={metrics!r}"
            )
        resolved.append((name or metric.name, metric, weighted))
    return resolved


def _in_scope(
    metric: keras.metrics.Metric, strategy: tf.distribute.Strategy, argument: str
) -> keras.metrics.Metric:
    """The metric itself if its variables belong to `strategy`, else a copy made in it."""
    if all(
        strategy.extended.variable_created_in_scope(getattr(v, "value", v))
        for v in metric.variables
    ):
        return metric
    try:
        return type(metric).from_config(metric.get_config())
    except Exception as error:
        raise ValueError(
            f"Argument `{argument}`: metric {metric.name!r} was created outside "
            f"`strategy.scope()` of the Trainer's strategy ({type(strategy).__name__}) "
            "and cannot be re-created from its config there; create it inside the "
            f"scope. Received: {metric!r} ({error})"
        ) from error


def _to_float(value: Any) -> Any:
    array = np.asarray(keras.ops.convert_to_numpy(value))
    return float(array) if array.ndim == 0 else array.tolist()
