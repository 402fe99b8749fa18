"""Independent references for the math, written from the formulas, not from our code.

The transformer of the text LM (`tf_adabatch.app.models`, "transformer") in numpy, from
its definition (a decoder-only, pre-LayerNorm transformer):

    x_0      = E[tokens] + P                                  (token and position embeddings)
    block l: a = LN_1(x);  x = x + MHA(a, a, causal)           (attention on the NORMALIZED input)
             f = LN_2(x);  x = x + W_2 gelu(W_1 f + b_1) + b_2
    logits   = W_out LN_f(x) + b_out

    LN(v)    = gamma (v - mean(v)) / sqrt(var(v) + 1e-5) + beta     (over the width)
    MHA(q,k) = sum_h softmax_j(Q_h(i) . K_h(j) / sqrt(d_h) + mask(i, j)) V_h(j) W_o,h + b_o
    mask     = 0 for j <= i, -inf for j > i (position i sees itself and the past)
    gelu(z)  = z Phi(z) = z (1 + erf(z / sqrt 2)) / 2

compared with the Keras model on random weights (every weight drawn, LayerNorm scales
and biases included, so that none of them can be skipped or swapped unseen).
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf

from tf_adabatch.app.models import _transformer

LENGTH, VOCAB, WIDTH, DEPTH, HEADS = 7, 13, 16, 2, 2


def layer_norm(v: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = v.mean(-1, keepdims=True)
    var = ((v - mean) ** 2).mean(-1, keepdims=True)
    return gamma * (v - mean) / np.sqrt(var + 1e-5) + beta


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def attention(a: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """Causal multi-head self-attention of a (batch, length, width) input."""
    q = np.einsum("blw,whd->blhd", a, w["query/kernel"]) + w["query/bias"]
    k = np.einsum("blw,whd->blhd", a, w["key/kernel"]) + w["key/bias"]
    v = np.einsum("blw,whd->blhd", a, w["value/kernel"]) + w["value/bias"]
    scores = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    future = np.triu(np.ones((a.shape[1], a.shape[1]), bool), k=1)  # j > i
    scores = np.where(future, -np.inf, scores)
    mixed = np.einsum("bhij,bjhd->bihd", softmax(scores), v)
    return (
        np.einsum("bihd,hdw->biw", mixed, w["attention_output/kernel"]) + w["attention_output/bias"]
    )


def gelu(z: np.ndarray) -> np.ndarray:
    return z * (1.0 + erf(z / np.sqrt(2.0))) / 2.0


def test_transformer_equals_a_numpy_forward_pass_from_its_definition() -> None:
    rng = np.random.default_rng(3)
    model = _transformer(LENGTH, VOCAB, width=WIDTH, depth=DEPTH, heads=HEADS)
    for weight in model.weights:  # every weight random: scales and biases too
        weight.assign(rng.normal(0.0, 0.3, weight.shape).astype("float32"))
    tokens = rng.integers(0, VOCAB, (3, LENGTH)).astype("int32")
    got = np.asarray(model(tokens))

    # The weights by layer, in the model's order (each kind in the order it is built).
    by_kind: dict[str, list] = {}
    for layer in model.layers:
        by_kind.setdefault(type(layer).__name__, []).append(layer)
    (embedding,) = by_kind["Embedding"]
    (position,) = by_kind["PositionEmbedding"]
    norms = [[np.asarray(w) for w in layer.weights] for layer in by_kind["LayerNormalization"]]
    dense = [[np.asarray(w) for w in layer.weights] for layer in by_kind["Dense"]]
    heads = [
        {w.path.split("/", 1)[1]: np.asarray(w) for w in layer.weights}
        for layer in by_kind["MultiHeadAttention"]
    ]
    assert len(norms) == 2 * DEPTH + 1 and len(dense) == 2 * DEPTH + 1 and len(heads) == DEPTH

    x = np.asarray(embedding.embeddings)[tokens] + np.asarray(position.embeddings)
    for block in range(DEPTH):
        a = layer_norm(x, *norms[2 * block])
        x = x + attention(a, heads[block])
        f = layer_norm(x, *norms[2 * block + 1])
        (w1, b1), (w2, b2) = dense[2 * block], dense[2 * block + 1]
        x = x + gelu(f @ w1 + b1) @ w2 + b2
    w_out, b_out = dense[-1]
    want = layer_norm(x, *norms[-1]) @ w_out + b_out

    assert got.shape == want.shape == (3, LENGTH, VOCAB)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    # Not a vacuous match: the logits vary, and the past cannot see the future.
    assert np.std(want) > 0.5
    changed = tokens.copy()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    np.testing.assert_allclose(np.asarray(model(changed))[:, :-1], got[:, :-1], atol=1e-5)
