"""The smoothed noise statistics recover |G|^2, tr(Sigma) and the noise scale.

Linear regression with a frozen weight (learning rate 0, so the truth never moves):
x ~ N(0, I_d), y = x.w* + eps, eps ~ N(0, s^2), model y_pred = x.w, per-example loss
(y_pred - y)^2. With delta = w - w*, the per-example gradient is
g = 2 x (x.delta - eps), so

  G = E g = 2 delta                                   |G|^2 = 4 |delta|^2
  E|g|^2 = 4 (E[(x.delta)^2 |x|^2] + s^2 E|x|^2) = 4 ((d + 2)|delta|^2 + d s^2)
  tr(Sigma) = E|g|^2 - |G|^2 = 4 ((d + 1)|delta|^2 + d s^2)

(E[(x.delta)^2 |x|^2] = (d + 2)|delta|^2 for Gaussian x, by Isserlis' theorem.)
With d = 8, |delta|^2 = 1, s = 1: |G|^2 = 4, tr(Sigma) = 68, noise scale = 17.

Sizes: B = 512 per step, n = 8 micro-gradients, 300 steps averaged with decay 0.999
(close to a plain mean over the run). The relative standard error of the tr(Sigma)
average is about sqrt(2 / ((n - 1) d)) / sqrt(300) ~ 1.1%, so 5% is > 4 standard errors.

The gain at base batch B0 = 16 (S = 32): r = (tr/B0 + |G|^2) / (tr/B + |G|^2)
= (68/16 + 4) / (68/512 + 4) = 1.996. r grows with tr(Sigma) and falls with |G|^2, so
with both smoothed moments within 5% (asserted first) r lies between
(0.95*68/16 + 1.05*4) / (0.95*68/512 + 1.05*4) = 1.904 and
(1.05*68/16 + 0.95*4) / (1.05*68/512 + 0.95*4) = 2.098: within 6% of 1.996, and far
from both clamps (1 and S = 32).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy

D, BATCH, STEPS, SEED = 8, 512, 300, 7
BASE = 16  # B0: S = 32
GRAD_SQR, TRACE = 4.0, 68.0


def run(replicas: int) -> tf_adabatch.Trainer:
    rng = np.random.default_rng(SEED)
    w_star = np.zeros((D, 1), np.float32)
    delta = np.full((D, 1), 1.0 / np.sqrt(D), np.float32)  # |delta|^2 = 1
    x = rng.normal(size=(BATCH * STEPS, D)).astype(np.float32)
    y = (x @ w_star + rng.normal(size=(BATCH * STEPS, 1))).astype(np.float32)
    strategy = get_strategy(replicas)
    with strategy.scope():
        model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
        model.layers[0].kernel.assign(w_star + delta)
        optimizer = keras.optimizers.SGD(0.0)
    micro_steps = 8 // replicas
    micro = BATCH // 8
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=micro,
        base_batch_size=BASE,
        policy=tf_adabatch.StaticPolicy(BATCH),
        similarity="estimated",
        ema_decay=0.999,
        strategy=strategy,
    )
    assert trainer.accumulation_steps == micro_steps
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(micro * replicas, drop_remainder=True)
    trainer.fit(data, steps=STEPS, verbose=0)
    return trainer


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_smoothed_moments_within_five_percent_of_truth(replicas: int) -> None:
    trainer = run(replicas)
    assert trainer.grad_sqr == pytest.approx(GRAD_SQR, rel=0.05)
    assert trainer.grad_var * trainer.engine.base_batch_size == pytest.approx(TRACE, rel=0.05)
    assert trainer.noise_scale == pytest.approx(TRACE / GRAD_SQR, rel=0.05)
    expected_gain = (TRACE / BASE + GRAD_SQR) / (TRACE / BATCH + GRAD_SQR)
    assert expected_gain == pytest.approx(1.996, abs=1e-3)
    assert trainer.gain == pytest.approx(expected_gain, rel=0.06)
