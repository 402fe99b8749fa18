"""The files the application reads at run time, found inside the installed package.

The repository's top-level `configs/` is installed as the package `tf_adabatch.app.configs`
(setup.py's `package_dir`): the shipped job configs, `profiles/` (the measured step-time
profiles) and `profiles/pollux_traces/` (the traces they were fitted to). One copy of each
file: an editable install reads the checkout's `configs/`, a wheel carries them. Everything
here goes through `importlib.resources`, never through paths relative to the repository.

>>> "fashion_mnist" in config_names()
True
>>> os.path.basename(config_path("synthetic"))
'synthetic.py'
>>> os.path.isfile(os.path.join(traces_dir(), "cifar10", "placements.csv"))
True
"""

from __future__ import annotations

import importlib.resources
import os
import pathlib

__all__ = [
    "CONFIGS_PACKAGE",
    "config_names",
    "config_path",
    "configs_dir",
    "profiles_dir",
    "traces_dir",
]

CONFIGS_PACKAGE = "tf_adabatch.app.configs"


def _package_dir(package: str) -> str:
    """The folder of an installed package of data (a real folder: zipped installs are refused)."""
    root = importlib.resources.files(package)
    if not isinstance(root, pathlib.Path) or not root.is_dir():
        raise RuntimeError(
            f"tf_adabatch reads its configs and profiles from files: package `{package}` must "
            f"be installed as a folder (not zipped). Received: {root!r}"
        )
    return str(root)


def configs_dir() -> str:
    """The folder of the shipped job configs (`configs/` in a checkout).

    >>> os.path.isfile(os.path.join(configs_dir(), "fashion_mnist.py"))
    True
    """
    return _package_dir(CONFIGS_PACKAGE)


def profiles_dir() -> str:
    """The folder of the step-time profiles (`configs/profiles/` in a checkout).

    >>> os.path.isfile(os.path.join(profiles_dir(), "cifar10_resnet18_t4.py"))
    True
    """
    return _package_dir(f"{CONFIGS_PACKAGE}.profiles")


def traces_dir() -> str:
    """The folder of the Pollux / AdaptDL traces (`configs/profiles/pollux_traces/`).

    >>> sorted(os.listdir(os.path.join(traces_dir(), "bert")))[:2]
    ['placements.csv', 'scalability.csv']
    """
    return os.path.join(profiles_dir(), "pollux_traces")


def config_names() -> list[str]:
    """The shipped job configs by name (each has a `get_config()`; `base` is their base).

    >>> "synthetic" in config_names() and "base" not in config_names()
    True
    """
    return sorted(
        entry[:-3]
        for entry in os.listdir(configs_dir())
        if entry.endswith(".py") and not entry.startswith("_") and entry != "base.py"
    )


def config_path(config: str) -> str:
    """The file of a config given by name (`fashion_mnist`) or by path (`configs/x.py`).

    A value that names an existing file, or that holds a path separator or ends in `.py`,
    is a path and is returned as it is (the config-file loader reports a missing one). A
    bare name is a shipped config. ml_collections' `FILE:ARGS` form keeps its `:ARGS`.

    Raises:
      ValueError: a bare name that is not a shipped config, naming the ones there are.

    >>> config_path("my_configs/x.py")
    'my_configs/x.py'
    >>> config_path("fashion_mnst")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Argument `config` must be a config file or the name of a shipped config (...). Received: config='fashion_mnst'
    """
    name, colon, args = config.partition(":")
    if os.path.exists(config) or os.sep in name or name.endswith(".py"):
        return config
    if name in config_names():
        return os.path.join(configs_dir(), f"{name}.py") + colon + args
    raise ValueError(
        "Argument `config` must be a config file or the name of a shipped config "
        f"({', '.join(config_names())}). Received: config={config!r}"
    )
