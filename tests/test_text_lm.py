"""The language-model workload: the pinned corpus, its windows, the causal transformer,
the config's rules (configs/text_lm.py runs end to end in tests/test_launch.py)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tf_adabatch.app.data import python_text
from tf_adabatch.app.models import build_model


def test_windows_pair_each_byte_with_the_next_one() -> None:
    data = bytes(range(10))  # 0..9
    x, y = python_text.windows(data, sequence_length=4)
    # (10 - 1) // 4 = 2 windows; the last byte (9) is only ever a label.
    assert x.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert y.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert x.dtype == np.int32 and y.dtype == np.int32
    with pytest.raises(ValueError, match=r"sequence_length.*>= 1.*Received: sequence_length=0"):
        python_text.windows(data, sequence_length=0)


def test_the_corpus_is_the_pinned_one_split_by_module() -> None:
    train, validation = (python_text.corpus(s) for s in ("train", "validation"))
    # corpus() checked each split's SHA-256; recomputed here so the check cannot be skipped.
    for split, data in (("train", train), ("validation", validation)):
        assert hashlib.sha256(data).hexdigest() == python_text.SHA256[split]
    assert (len(train), len(validation)) == (2_366_714, 219_405)
    modules = python_text.MODULES
    assert not set(modules["train"]) & set(modules["validation"])
    assert sorted(modules["train"] + modules["validation"]) == list(range(100))
    assert validation == b"".join(python_text.module_source(i) for i in modules["validation"])
    (x, _), (xv, yv) = python_text.load()
    assert x.shape == ((len(train) - 1) // 64, 64) and xv.shape == ((len(validation) - 1) // 64, 64)
    assert bytes(x[0].astype(np.uint8)) == train[:64]
    assert int(yv[-1, -1]) == validation[64 * len(xv)]  # the byte after the last window


def test_the_corpus_is_python_source_of_the_interpreters_independent_generator() -> None:
    """Every module is Python that compiles without a warning (the grammar's), ASCII,
    and the same bytes from a fresh generator (no state carried between modules or
    calls)."""
    import warnings

    for index in (0, 5, 99):
        source = python_text.module_source(index)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(source, f"<module {index}>", "exec")
        assert source == python_text.module_source(index)
        assert source.isascii() and 8_000 <= len(source) < 60_000
    assert python_text.module_source(0) != python_text.module_source(1)


def test_a_corpus_that_differs_is_refused_with_one_line_naming_the_split_and_both_hashes() -> None:
    copy = python_text.module_source
    assert python_text.corpus("validation", modules=copy)  # the same bytes pass

    def changed(index: int) -> bytes:
        return copy(index) + (b"\n" if index == 15 else b"")

    with pytest.raises(ValueError, match=r"validation split.*not the pinned") as err:
        python_text.corpus("validation", modules=changed)
    message = str(err.value)
    assert python_text.SHA256["validation"] in message and "\n" not in message
    digest = hashlib.sha256(b"".join(changed(i) for i in python_text.MODULES["validation"]))
    assert digest.hexdigest() in message
    with pytest.raises(ValueError, match=r"split.*Received: split='test'"):
        python_text.corpus("test")


def test_the_transformer_is_causal_and_its_size_is_derived_by_hand() -> None:
    model = build_model("transformer", (64,), 256)
    # width d = 128, ff = 4d = 512, vocabulary V = 256, length L = 64, 3 blocks:
    #   token embedding V d = 32,768; positions L d = 8,192
    #   per block: 2 LayerNorms 2 x 2d = 512; attention q, k, v, out 4 (d d + d) = 66,048;
    #     dense d -> 4d: 4d d + 4d = 66,048; dense 4d -> d: 4d d + d = 65,664 -> 198,272
    #   final LayerNorm 2d = 256; logits d V + V = 33,024
    expected = 32_768 + 8_192 + 3 * 198_272 + 256 + 33_024
    assert model.count_params() == expected == 669_056
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(2, 64)).astype(np.int32)
    changed = x.copy()
    changed[:, 40:] = (changed[:, 40:] + 1) % 256
    a, b = model(x).numpy(), model(changed).numpy()
    assert np.array_equal(a[:, :40], b[:, :40])  # no position sees a later byte
    assert not np.allclose(a[:, 40:], b[:, 40:])
    with pytest.raises(ValueError, match=r"input_shape.*\(sequence_length,\).*\(8, 8, 1\)"):
        build_model("transformer", (8, 8, 1), 10)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"model": "cnn"}, "model"),  # images' model on text
        ({"dataset": "digits"}, "model"),  # the transformer on images
        ({"optimizer.name": "adam"}, "optimizer.name"),
        ({"optimizer.weight_decay": -0.1}, "optimizer.weight_decay"),
    ],
)
def test_the_config_rules_name_the_field(overrides: dict, field: str) -> None:
    from configs import text_lm
    from tf_adabatch.app import ConfigError, validate_config

    config = text_lm.get_config()
    validate_config(config)  # the shipped config passes
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        setattr(config[section] if section else config, name, value)
    with pytest.raises(ConfigError, match=rf"`{field}`"):
        validate_config(config)


def test_the_optimizer_follows_the_config() -> None:
    import keras

    from configs import base, text_lm
    from tf_adabatch.app import factories

    adamw = factories.make_optimizer(text_lm.get_config(), base_steps=100)
    assert isinstance(adamw, keras.optimizers.AdamW)
    assert adamw.weight_decay == pytest.approx(0.01)
    sgd = factories.make_optimizer(base.get_config(), base_steps=100)
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.weight_decay is None


def test_a_launcher_run_on_another_corpus_stops_with_one_config_line(tmp_path, monkeypatch) -> None:
    from configs import text_lm
    from tf_adabatch import app
    from tf_adabatch.app.data import pipeline

    pipeline.load_arrays.cache_clear()  # the real corpus may be cached by an earlier test
    monkeypatch.setitem(python_text.SHA256, "train", "0" * 64)
    config = text_lm.get_config()
    config.strategy = "one_device"
    try:
        with pytest.raises(app.ConfigError, match=r"`dataset` \('python_text'\): The train split"):
            app.run(config, str(tmp_path / "run"), verbose=0)
    finally:
        pipeline.load_arrays.cache_clear()
