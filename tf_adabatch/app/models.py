"""The small Keras models the shipped configs train (build inside the strategy scope)."""

from __future__ import annotations

import keras

__all__ = ["MODELS", "build_model"]

MODELS = ("cnn", "mlp")


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int = 0
) -> keras.Model:
    """Returns a freshly initialised classifier producing logits.

    Args:
      name: "cnn" (two conv blocks and a dense layer, ~200k parameters at 28x28) or
        "mlp" (one hidden layer of 64).
      input_shape: one example's shape, e.g. (28, 28, 1).
      num_classes: number of logits.
      seed: initialisation seed.

    Example:

    >>> model = build_model("mlp", (8, 8, 1), 10)
    >>> model.output_shape
    (None, 10)
    """
    if name not in MODELS:
        raise ValueError(f"Argument `name` must be one of {MODELS}. Received: name={name!r}")
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    if name == "cnn":
        body = [
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
        ]
    else:
        body = [layers.Flatten(), layers.Dense(64, activation="relu")]
    return keras.Sequential([keras.Input(input_shape), *body, layers.Dense(num_classes)], name=name)
