"""launch/train.py end to end: every shipped config, resume after a kill, bad input."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from configs import base
from tf_adabatch import app, summaries
from tf_adabatch.app import resources
from tf_adabatch.app.data import pipeline
from tf_adabatch.app.models import build_model

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.py") if p.name != "__init__.py")
TEXT_CONFIGS = ("text_lm.py",)  # written out: a config that stopped being text fails here
TIMEOUT_S = 300
FAST = [
    "--config.train.max_steps=3",
    "--config.num_cpu_replicas=2",
    "--config.train.eval_batch_size=2000",
]


def launch(
    config: str, workdir: Path, *flags: str, timeout: int = TIMEOUT_S
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / config}",
        f"--workdir={workdir}",
        *flags,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def evaluate_saved_weights(config: str, workdir: Path) -> tuple[float, float]:
    """Test accuracy (per position for text) and cross-entropy in bits of the latest
    checkpoint in `workdir`, without the Trainer: a fresh model, plain Keras and numpy."""
    module = importlib.import_module(f"configs.{config[: -len('.py')]}")
    cfg = module.get_config()
    _, (x_test, y_test), num_classes = pipeline.load_arrays(cfg.dataset, seed=cfg.seed)
    model = build_model(cfg.model, x_test.shape[1:], num_classes, seed=cfg.seed + 1)
    latest = tf.train.latest_checkpoint(str(workdir / "checkpoints"))
    tf.train.Checkpoint(model=model).read(latest).expect_partial().assert_existing_objects_matched()
    logits = model.predict(x_test, batch_size=1000, verbose=0).astype(np.float64)
    labels = np.asarray(y_test).reshape(logits.shape[:-1])
    # log softmax by hand: log p(label) = logit(label) - logsumexp(logits)
    top = logits.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
    chosen = np.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    bits = float(np.mean(log_norm - chosen) / np.log(2.0))
    return float(np.mean(np.argmax(logits, axis=-1) == labels)), bits


def run_in_one_process(cases: dict[str, list[str]], folder: Path, timeout: int) -> dict[str, dict]:
    """Runs `launch/train.py`'s own `parse_flags` and `main` on each case's argv in one
    shared subprocess (tests/launch_cases.py): {case: {code, stdout, stderr}}."""
    (folder / "cases.json").write_text(json.dumps(cases))
    cmd = [sys.executable, str(ROOT / "tests" / "launch_cases.py"), str(folder / "cases.json")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.splitlines()[-1])
    assert sorted(results) == sorted(cases)
    return results


MAIN_CONFIG = "fashion_mnist.py"  # the README's main job


@pytest.fixture(scope="module")
def config_runs(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """Every shipped config, 3 steps each: the main job as its own process on 2 mirrored
    replicas; the others in one shared process (one TensorFlow start-up and one data
    load for all) on one device, since a second mirrored strategy in a process fails
    (its collective ops clash with the first's). The mirrored path is also run by the
    resume, evaluation and multi-worker tests below."""
    root = tmp_path_factory.mktemp("configs")
    cases = {
        config: [
            f"--config={ROOT / 'configs' / config}",
            f"--workdir={root / config}",
            *FAST,
            "--config.strategy=one_device",
        ]
        for config in CONFIGS
        if config != MAIN_CONFIG
    }
    results = run_in_one_process(cases, root, timeout=len(CONFIGS) * TIMEOUT_S)
    main = launch(MAIN_CONFIG, root / MAIN_CONFIG, *FAST)
    results[MAIN_CONFIG] = {"code": main.returncode, "stdout": main.stdout, "stderr": main.stderr}
    return root, results


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_runs_a_few_steps(config: str, config_runs) -> None:
    root, results = config_runs
    workdir = root / config
    assert results[config]["code"] == 0, results[config]["stderr"][-3000:]
    metrics = json.loads((workdir / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 3
    assert metrics["replicas"] == (2 if config == MAIN_CONFIG else 1)
    # The reported accuracy equals an independent evaluation of the saved weights: the
    # final checkpoint restored into a fresh model, predicted with plain Keras.
    accuracy, bits = evaluate_saved_weights(config, workdir)
    assert metrics["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    # The loss is the same cross-entropy in nats; text configs also report it in bits.
    assert metrics["test_loss"] == pytest.approx(bits * np.log(2.0), rel=1e-4)
    if config in TEXT_CONFIGS:
        assert metrics["test_bits_per_byte"] == pytest.approx(bits, rel=1e-4)
    else:
        assert "test_bits_per_byte" not in metrics
    assert (workdir / "tensorboard" / "train").is_dir() and (workdir / "checkpoints").is_dir()
    assert "Final test accuracy" in results[config]["stdout"]


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    flags = ["--config.train.checkpoint_every_steps=5", "--config.train.base_epochs=200"]
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / 'synthetic.py'}",
        f"--workdir={tmp_path}",
        *flags,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + TIMEOUT_S
        while not list((tmp_path / "checkpoints").glob("ckpt-*.index")):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.2)
        time.sleep(1.0)  # let it train on past the checkpoint
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    # The checkpoint the manager will restore (a kill can land between writing a
    # checkpoint's files and recording it as the latest).
    latest = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    assert latest is not None
    saved = [int(latest.rsplit("-", 1)[1])]
    result = launch(
        "synthetic.py", tmp_path, *flags, "--config.train.max_steps=" + str(saved[-1] + 5)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resumed from {tmp_path / 'checkpoints' / f'ckpt-{saved[-1]}'}" in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["optimizer_steps"] == saved[-1] + 5


SYNTHETIC = str(ROOT / "configs" / "synthetic.py")
BROKEN_CONFIGS = {
    "syntax_error": ("def get_config(:\n", r"line 1: invalid syntax"),
    "name_error": (
        "def get_config():\n    return undefined_name\n",
        r"line 2: NameError: name 'undefined_name' is not defined",
    ),
    "plain_dict": ("def get_config():\n    return {'seed': 0}\n", None),
    "raises": (
        "def get_config():\n    raise RuntimeError('no such setting')\n",
        r"line 2: RuntimeError: no such setting",
    ),
    "string_number": (
        "from configs import base\n\n\ndef get_config():\n    c = base.get_config()\n"
        "    c.micro_batch_size = '32'\n    return c\n",
        r"line 6: TypeError: Could not override field 'micro_batch_size' .*"
        r"32 is of original type <class 'str'> and cannot be casted to type <class 'int'>",
    ),
}
BAD_FLAGS = {
    "stray": (
        "stray",
        "error: unexpected positional argument(s): stray (flags are --name=value)",
    ),
    "not_an_integer": (
        "--config.micro_batch_size=abc",
        "error: Config field `micro_batch_size` must be an integer. Received: micro_batch_size='abc'",
    ),
    "not_a_number": (
        "--config.optimizer.learning_rate=fast",
        "error: Config field `optimizer.learning_rate` must be a number. Received: optimizer.learning_rate='fast'",
    ),
    "none_where_not_allowed": (
        "--config.micro_batch_size=None",
        "error: Config field `micro_batch_size` must be an integer >= 1. Received: micro_batch_size=None",
    ),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """Every refused command line below, run by `launch/train.py`'s own `parse_flags` and
    `main` in one shared subprocess (tests/launch_cases.py): (folder, results by case)."""
    root = tmp_path_factory.mktemp("refusals")
    cases: dict[str, list[str]] = {
        "mistyped": [
            f"--config={SYNTHETIC}",
            f"--workdir={root / 'mistyped'}",
            "--config.policy.target_similarty=0.3",
        ],
        "bad_value": [
            f"--config={SYNTHETIC}",
            f"--workdir={root / 'bad_value'}",
            "--config.policy.target_similarity=1.3",
        ],
        "missing_config": [
            f"--config={ROOT / 'configs' / 'no_such_config.py'}",
            f"--workdir={root / 'missing'}",
        ],
        # A shipped config by name (tf_adabatch.app.resources), as from an installed package.
        "unknown_name": ["--config=synthtic", f"--workdir={root / 'unknown_name'}"],
        "by_name": [
            "--config=synthetic",
            f"--workdir={root / 'by_name'}",
            "--config.policy.target_similarity=1.3",
        ],
        "workdir_is_a_file": [f"--config={SYNTHETIC}", f"--workdir={root / 'a_file'}"],
        "no_tpu": [f"--config={SYNTHETIC}", f"--workdir={root / 'tpu'}", "--config.strategy=tpu"],
        # Not run by srun: no SLURM_* variables (the test process has none; checked below).
        "slurm_outside_srun": [
            f"--config={SYNTHETIC}",
            f"--workdir={root / 'slurm'}",
            "--config.strategy=multi_worker",
            "--config.cluster=slurm",
        ],
    }
    (root / "a_file").write_text("")
    for name, (source, _) in BROKEN_CONFIGS.items():
        (root / f"{name}.py").write_text(source)
        cases[f"broken_{name}"] = [f"--config={root / f'{name}.py'}", f"--workdir={root / name}"]
    for name, (flag, _) in BAD_FLAGS.items():
        cases[f"flag_{name}"] = [f"--config={SYNTHETIC}", f"--workdir={root / name}", flag]
    results = run_in_one_process(cases, root, timeout=TIMEOUT_S)
    return root, results


def refused(results: dict, case: str) -> list[str]:
    """The case's `error:` lines, after checking it exited 2 without a traceback."""
    outcome = results[case]
    assert outcome["code"] == 2 and "Traceback" not in outcome["stderr"], outcome["stderr"][-2000:]
    return [line for line in outcome["stderr"].splitlines() if line.startswith("error:")]


def test_mistyped_field_fails_with_a_suggestion(refusals) -> None:
    errors = refused(refusals[1], "mistyped")
    assert len(errors) == 1
    assert errors[0].startswith("error: 'target_similarty' Did you mean \"target_similarity\"")


def test_a_config_by_name_is_the_shipped_file_and_an_unknown_name_one_line(refusals) -> None:
    """`--config=synthetic` loads the packaged synthetic config (its override is checked
    against that config's fields: the same refusal as with the file's path); a name that
    is no shipped config stops with one line listing the names."""
    assert refused(refusals[1], "by_name") == refused(refusals[1], "bad_value")
    names = ", ".join(resources.config_names())
    assert "synthetic" in names and "fashion_mnist" in names
    assert refused(refusals[1], "unknown_name") == [
        "error: Argument `config` must be a config file or the name of a shipped config "
        f"({names}). Received: config='synthtic'"
    ]


def test_bad_value_fails_with_one_clear_line(refusals) -> None:
    assert refused(refusals[1], "bad_value") == [
        "error: Config field `policy.target_similarity`: Argument `target_similarity` must be in (0, 1). Received: target_similarity=1.3"
    ]


def with_value(field: str, value) -> ml_collections.ConfigDict:
    """base.get_config() with `field` set to `value` of any type (a ConfigDict built from
    a dict, as a config file may do; the base's typed fields refuse other types)."""
    values = base.get_config().to_dict()
    parent, _, leaf = field.rpartition(".")
    (values[parent] if parent else values)[leaf] = value
    return ml_collections.ConfigDict(values)


@pytest.mark.parametrize(
    "field,value,match",
    [
        (
            "dataset",
            "cifar10",
            r"Config field `dataset` must be one of \('fashion_mnist', 'digits', 'synthetic', 'python_text'\). Received: dataset='cifar10'",
        ),
        (
            "strategy",
            "horovod",
            r"Config field `strategy` must be one of .* Received: strategy='horovod'",
        ),
        (
            "lr.rule",
            "cubic",
            r"Config field `lr.rule`: Argument `rule` must be one of \(.adascale., .sqrt., .linear., .none.\). Received: rule=.cubic.",
        ),
        (
            "lr.gain_power",
            2.0,
            r"Config field `lr.gain_power`: Argument `gain_power` must be in \(0, 1\]. Received: gain_power=2.0",
        ),
        (
            "policy.min_batch_size",
            4096,
            r"Config field `policy.min_batch_size`: Argument `min_batch_size` must be <= `max_batch_size`",
        ),
        (
            "policy.max_batch_size",
            2000,
            r"Config field `policy.max_batch_size` must be a multiple of num_cpu_replicas x micro_batch_size = 4 x 32 = 128 to be reachable. Received: policy.max_batch_size=2000",
        ),
        (
            "base_batch_size",
            0,
            r"Config field `base_batch_size` must be an integer >= 1. Received: base_batch_size=0",
        ),
        (
            "train.base_epochs",
            -1.0,
            r"Config field `train.base_epochs` must be a finite number > 0",
        ),
        (
            "train.max_consecutive_skips",
            0,
            r"Config field `train.max_consecutive_skips` must be an integer >= 1 or None. Received: train.max_consecutive_skips=0",
        ),
        (
            "train.preemption",
            "yes",
            r"Config field `train.preemption` must be True or False. Received: train.preemption='yes'",
        ),
        (
            "train.base_epochs",
            float("inf"),
            r"Config field `train.base_epochs` must be a finite number > 0. Received: train.base_epochs=inf",
        ),
        (
            "train.eval_batch_size",
            0,
            r"Config field `train.eval_batch_size` must be an integer >= 1. Received: train.eval_batch_size=0",
        ),
        ("seed", -1, r"Config field `seed` must be an integer >= 0. Received: seed=-1"),
        (
            "micro_batch_size",
            "32",
            r"Config field `micro_batch_size` must be an integer >= 1. Received: micro_batch_size='32'",
        ),
        (
            "optimizer.learning_rate",
            "0.1",
            r"Config field `optimizer.learning_rate` must be a finite number > 0. Received: optimizer.learning_rate='0.1'",
        ),
        (
            "optimizer.learning_rate",
            float("inf"),
            r"Config field `optimizer.learning_rate` must be a finite number > 0. Received: optimizer.learning_rate=inf",
        ),
        (
            "lr.warmup_base_epochs",
            1.0,
            r"Config field `lr.warmup_base_epochs` must be 0 unless lr.rule='linear' \(lr.rule='adascale' has no warm-up\). Received: lr.warmup_base_epochs=1.0",
        ),
        (
            "train.max_steps",
            2.5,
            r"Config field `train.max_steps` must be an integer >= 1 or None. Received: train.max_steps=2.5",
        ),
        (
            "train.steps_per_execution",
            0,
            r"Config field `train.steps_per_execution` must be an integer >= 1. Received: train.steps_per_execution=0",
        ),
        (
            "train.rollback",
            "none",
            r"Config field `train.rollback` must be 'copy' or 'stop'. Received: train.rollback='none'",
        ),
    ],
)
def test_validate_config_names_field_rule_and_value(field: str, value, match: str) -> None:
    config = with_value(field, value)
    with pytest.raises(app.ConfigError, match=match):
        app.validate_config(config)


def test_a_static_batch_must_be_reachable() -> None:
    """Static policy: the batch must be a multiple of replicas x micro-batch (4 x 32)."""
    config = base.get_config()
    config.policy.kind = "static"
    config.policy.initial_batch_size = 200
    with pytest.raises(
        app.ConfigError,
        match=r"Config field `policy.initial_batch_size` must be a multiple of num_cpu_replicas x micro_batch_size = 4 x 32 = 128 to be reachable. Received: policy.initial_batch_size=200",
    ):
        app.validate_config(config)
    # One device in exact-similarity mode: two micro-steps at least.
    config.strategy, config.policy.initial_batch_size = "one_device", 32
    with pytest.raises(
        app.ConfigError,
        match=r"multiple of replicas \(one_device\) x micro_batch_size = 1 x 32 = 32, at least 64 .* Received: policy.initial_batch_size=32",
    ):
        app.validate_config(config)
    config.policy.initial_batch_size = 64
    app.validate_config(config)


def test_numpy_integers_and_none_are_valid_config_values() -> None:
    config = with_value("micro_batch_size", np.int64(32))
    config.train.max_consecutive_skips = None  # never stop (configs/base.py)
    config.train.max_steps = None
    app.validate_config(config)
    app.validate_config(with_value("train.max_steps", np.int32(5)))


def test_mirrored_batch_bounds_are_checked_against_the_gpus_when_there_are_some(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2 GPUs x micro-batch 32 = 64: a max batch of 2112 = 33 x 64 is reachable on the
    GPUs (not on the 4 CPU replicas that num_cpu_replicas would simulate without them)."""
    config = base.get_config()
    config.policy.max_batch_size = 2112
    with pytest.raises(app.ConfigError, match="num_cpu_replicas x micro_batch_size"):
        app.validate_config(config)
    real = tf.config.list_physical_devices
    gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda kind=None: gpus if kind == "GPU" else real(kind)
    )
    app.validate_config(config)
    config.policy.max_batch_size = 2080
    with pytest.raises(
        app.ConfigError,
        match=r"must be a multiple of local GPUs x micro_batch_size = 2 x 32 = 64 to be reachable. Received: policy.max_batch_size=2080",
    ):
        app.validate_config(config)


def test_config_that_is_not_a_config_dict_is_refused() -> None:
    with pytest.raises(
        app.ConfigError,
        match=r"Argument `config` must be an ml_collections.ConfigDict .* Received: config of type dict",
    ):
        app.validate_config({"dataset": "digits"})


@pytest.mark.parametrize("name", sorted(BROKEN_CONFIGS))
def test_broken_config_file_fails_with_one_clear_line(refusals, name: str) -> None:
    root, results = refusals
    path, expected = root / f"{name}.py", BROKEN_CONFIGS[name][1]
    errors = refused(results, f"broken_{name}")
    assert len(errors) == 1, results[f"broken_{name}"]["stderr"]
    if expected is None:
        assert "Argument `config` must be an ml_collections.ConfigDict" in errors[0]
        assert "Received: config of type dict" in errors[0]
    else:
        assert errors[0].startswith(f"error: --config: {path} ")
        assert re.search(expected, errors[0]), errors[0]


@pytest.mark.parametrize("name", sorted(BAD_FLAGS))
def test_bad_flag_fails_with_one_clear_line(refusals, name: str) -> None:
    assert refused(refusals[1], f"flag_{name}") == [BAD_FLAGS[name][1]]


def test_slurm_cluster_outside_a_slurm_task_fails_with_one_clear_line(refusals) -> None:
    assert not [name for name in os.environ if name.startswith("SLURM_")]
    assert refused(refusals[1], "slurm_outside_srun") == [
        "error: Config field `cluster`='slurm' needs the environment of a SLURM task (run "
        "under `srun`). Not set: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, "
        "SLURM_STEP_TASKS_PER_NODE"
    ]


def test_tpu_strategy_without_a_tpu_fails_with_one_clear_line(refusals) -> None:
    (line,) = refused(refusals[1], "no_tpu")
    assert line.startswith(
        "error: Config field `strategy` is 'tpu' but no TPU could be reached from this machine"
    ), line
    assert line.endswith("Received: strategy='tpu'")


def test_workdir_that_is_a_file_fails_with_one_clear_line(refusals) -> None:
    root, results = refusals
    assert refused(results, "workdir_is_a_file") == [
        "error: Argument `workdir` must be a writable folder (or a path where one can be "
        f"created). Received: workdir='{root / 'a_file'}' (a file)"
    ]


def test_unreadable_checkpoints_stop_with_one_line_and_none_overrides_parse(tmp_path: Path) -> None:
    """Checkpoints that exist but cannot be read: exit 2 and one line, nothing started
    over. The run gets that far only if `--config.X=None` parsed; TF's C++ start-up
    lines (at TF_CPP_MIN_LOG_LEVEL=0) are printed once, not twice."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "ckpt-3.index").write_bytes(b"garbage index")
    (ckpts / "ckpt-3.data-00000-of-00001").write_bytes(b"garbage data")
    before = sorted(p.name for p in ckpts.iterdir())
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / 'synthetic.py'}",
        f"--workdir={tmp_path}",
        "--config.train.max_consecutive_skips=None",
        "--config.train.max_steps=None",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=env
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: No readable checkpoint in {ckpts}")
    assert "ckpt-3: " in errors[0]
    assert sorted(p.name for p in ckpts.iterdir()) == before  # nothing renamed or deleted
    for line in set(result.stderr.splitlines()):
        if re.match(r"^[IWEF]\d{4} ", line):
            assert result.stderr.count(line.split("] ", 1)[-1]) == 1, line
    assert "before absl::InitializeLog()" not in result.stderr


def test_evaluations_during_training_are_printed_one_line_each(tmp_path: Path) -> None:
    """Static batch B0 = 32 on the synthetic set's 4,096 examples: an epoch is 128 base
    steps, so evaluating every 1/64 epoch is every 2.0 of progress; at the base batch
    the gain is 1 and progress is the step count. Expected, by hand: evaluations at
    steps 2, 4 and 6 (the last is also the final one: evaluated once)."""
    result = launch(
        "synthetic.py",
        tmp_path,
        "--config.strategy=one_device",
        "--config.policy.kind=static",
        "--config.train.max_steps=6",
        "--config.train.eval_every_base_epochs=0.015625",
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [
        line
        for line in result.stdout.replace("\r", "\n").splitlines()
        if "Evaluation at step" in line
    ]
    # Each evaluation on its own line (not glued to the progress bar), one per
    # evaluation written to TensorBoard.
    assert lines and all(line.startswith("Evaluation at step ") for line in lines), lines
    written = summaries.read_scalars(str(tmp_path / "tensorboard" / "eval"))[
        summaries.eval_tag("loss")
    ]
    assert [int(line.split()[3]) for line in lines] == [2, 4, 6]
    assert [step for step, _ in written] == [2, 4, 6]
    # Each evaluation also records the seconds spent training so far (evaluations
    # excluded): one value per evaluation, increasing, within the run's totals.
    seconds = summaries.read_scalars(str(tmp_path / "tensorboard" / "eval"))[
        summaries.TRAIN_SECONDS
    ]
    assert [step for step, _ in seconds] == [step for step, _ in written]
    values = [value for _, value in seconds]
    assert values[0] > 0 and all(a < b for a, b in itertools.pairwise(values))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert values[-1] <= metrics["train_seconds"] <= metrics["wall_time_s"]


def test_multiworker_launcher_exits_138_when_a_worker_is_killed(tmp_path: Path) -> None:
    """Worker 1's config file SIGKILLs its own process: the launcher stops worker 0 and
    exits with train.py's lost-worker code (`WORKER_LOST_EXIT_CODE`, 138), not 256 - 9."""
    config = tmp_path / "dies_on_worker_1.py"
    config.write_text(
        "import json, os, signal\n"
        "from configs import synthetic\n\n\n"
        "def get_config():\n"
        "    if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return synthetic.get_config()\n"
    )
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "multiworker.py"),
        "--num_workers=2",
        "--timeout=120",
        "--",
        f"--config={config}",
        f"--workdir={tmp_path / 'run'}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == app.WORKER_LOST_EXIT_CODE == 138, result.stderr[-2000:]
    assert "error: worker 1 was killed (SIGKILL); stopping the others." in result.stderr


def test_missing_config_file_fails_with_one_clear_line(refusals) -> None:
    errors = refused(refusals[1], "missing_config")
    assert len(errors) == 1
    assert errors[0].startswith("error: --config:") and "No such file" in errors[0]


def test_local_multiworker_launcher_trains_digits_with_two_workers(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "multiworker.py"),
        "--num_workers=2",
        f"--timeout={TIMEOUT_S}",
        "--",
        f"--config={ROOT / 'configs' / 'digits.py'}",
        f"--workdir={tmp_path}",
        "--config.train.base_epochs=4",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S + 60, cwd=ROOT)
    assert result.returncode == 0, (result.stderr + (tmp_path / "worker-1.log").read_text())[-3000:]
    chief = json.loads((tmp_path / "metrics.json").read_text())
    other = json.loads((tmp_path / "worker-1" / "metrics.json").read_text())
    assert chief["replicas"] == 2
    for key in ("test_accuracy", "test_loss", "optimizer_steps", "examples_seen", "progress"):
        assert chief[key] == other[key]
    assert chief["test_accuracy"] > 0.8
