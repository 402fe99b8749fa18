"""The small Keras models the shipped configs train (build inside the strategy scope)."""

from __future__ import annotations

import keras

__all__ = ["MODELS", "SEQUENCE_MODELS", "PositionEmbedding", "build_model"]

MODELS = ("cnn", "mlp", "transformer")
#: Models of token sequences (the text datasets'); the others take images.
SEQUENCE_MODELS = ("transformer",)


@keras.saving.register_keras_serializable(package="tf_adabatch")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per position to a (batch, length, width) input.

    Keras itself has no position embedding (keras-hub has one, a large dependency for
    these few lines).

    >>> import numpy as np
    >>> layer = PositionEmbedding()
    >>> out = layer(np.zeros((2, 3, 4), "float32"))
    >>> tuple(out.shape), tuple(layer.embeddings.shape)
    ((2, 3, 4), (3, 4))
    """

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        self.embeddings = self.add_weight(
            shape=(input_shape[-2], input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="embeddings",
        )

    def call(self, inputs):  # type: ignore[no-untyped-def]
        return inputs + keras.ops.cast(self.embeddings, inputs.dtype)


def _transformer(
    sequence_length: int, vocabulary: int, *, width: int = 128, depth: int = 3, heads: int = 4
) -> keras.Model:
    """A decoder-only (causal) pre-LayerNorm transformer: next-token logits per position."""
    layers = keras.layers
    tokens = keras.Input((sequence_length,), dtype="int32")
    x = layers.Embedding(vocabulary, width)(tokens)
    x = PositionEmbedding()(x)
    for _ in range(depth):
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        h = layers.MultiHeadAttention(heads, width // heads)(h, h, use_causal_mask=True)
        x = layers.Add()([x, h])
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        h = layers.Dense(4 * width, activation="gelu")(h)
        x = layers.Add()([x, layers.Dense(width)(h)])
    x = layers.LayerNormalization(epsilon=1e-5)(x)
    return keras.Model(tokens, layers.Dense(vocabulary)(x), name="transformer")


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int = 0
) -> keras.Model:
    """Returns a freshly initialised model producing logits.

    Args:
      name: "cnn" (two conv blocks and a dense layer, ~200k parameters at 28x28),
        "mlp" (one hidden layer of 64), or "transformer" (a byte-level causal language
        model: 3 blocks of width 128 with 4 heads, ~0.67M parameters at 256 symbols;
        logits over the next token at every position).
      input_shape: one example's shape, e.g. (28, 28, 1), or (sequence_length,) for the
        transformer.
      num_classes: number of logits (the vocabulary, for the transformer).
      seed: initialisation seed.

    Raises:
      ValueError: an unknown `name`, or a transformer `input_shape` that is not
        (sequence_length,).

    Example:

    >>> model = build_model("mlp", (8, 8, 1), 10)
    >>> model.output_shape
    (None, 10)
    >>> build_model("transformer", (64,), 256).output_shape
    (None, 64, 256)
    """
    if name not in MODELS:
        raise ValueError(f"Argument `name` must be one of {MODELS}. Received: name={name!r}")
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    if name == "transformer":
        if len(input_shape) != 1:
            raise ValueError(
                "Argument `input_shape` must be (sequence_length,) for the transformer. "
                f"Received: input_shape={input_shape}"
            )
        return _transformer(int(input_shape[0]), num_classes)
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
