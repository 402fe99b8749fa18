"""A real text corpus that every machine with Python has: the standard library's own source.

The language-model config (`configs/text_lm.py`) trains on 94 top-level modules of the
running interpreter's standard library (`sysconfig.get_paths()["stdlib"]`), read as bytes
(a byte-level model: 256 symbols, no tokenizer): those of 8-60 kB, but for the
machine-specific `_sysconfigdata_*`. The corpus is pinned: the file lists below, and the
SHA-256 of each split's bytes (its files concatenated in the listed order) as CPython
3.11.7 ships them; another interpreter's files give a clear error instead of a silently
different corpus. Train and validation are split by file (of the sorted list, every tenth
module from the sixth is held out), so the validation loss is measured on code the model
never saw, not on other windows of the same files.

Examples are windows of `sequence_length + 1` consecutive bytes, one every
`sequence_length` bytes: the input is the first `sequence_length` bytes, the label of each
position the byte after it.

>>> x, y = windows(b"abcdefgh", sequence_length=3)
>>> x.tolist(), y.tolist()  # "abc" -> "bcd", "def" -> "efg"
([[97, 98, 99], [100, 101, 102]], [[98, 99, 100], [101, 102, 103]])
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig

import numpy as np

__all__ = ["FILES", "SEQUENCE_LENGTH", "SHA256", "VOCABULARY", "corpus", "load", "windows"]

#: Bytes per example (the model's context).
SEQUENCE_LENGTH = 64
#: Byte-level: every byte value is a symbol.
VOCABULARY = 256
#: The pinned module lists, by split (files `<name>.py` of the standard library).
FILES: dict[str, tuple[str, ...]] = {
    "train": (
        "_collections_abc",
        "_compat_pickle",
        "_markupbase",
        "_osx_support",
        "_strptime",
        "asynchat",
        "asyncore",
        "base64",
        "bdb",
        "bz2",
        "calendar",
        "cgi",
        "cgitb",
        "cmd",
        "codecs",
        "compileall",
        "configparser",
        "contextlib",
        "copy",
        "csv",
        "dataclasses",
        "dis",
        "filecmp",
        "fractions",
        "ftplib",
        "functools",
        "gettext",
        "glob",
        "graphlib",
        "gzip",
        "hashlib",
        "heapq",
        "imp",
        "lzma",
        "mailcap",
        "mimetypes",
        "modulefinder",
        "nntplib",
        "ntpath",
        "numbers",
        "opcode",
        "os",
        "pathlib",
        "pipes",
        "pkgutil",
        "platform",
        "plistlib",
        "poplib",
        "posixpath",
        "pprint",
        "pstats",
        "pyclbr",
        "queue",
        "random",
        "runpy",
        "selectors",
        "shelve",
        "shlex",
        "shutil",
        "smtpd",
        "smtplib",
        "socket",
        "socketserver",
        "ssl",
        "statistics",
        "string",
        "stringprep",
        "sunau",
        "sysconfig",
        "tabnanny",
        "telnetlib",
        "tempfile",
        "textwrap",
        "threading",
        "timeit",
        "tokenize",
        "trace",
        "tracemalloc",
        "types",
        "uuid",
        "warnings",
        "wave",
        "weakref",
        "webbrowser",
        "zipimport",
    ),
    "validation": (
        "aifc",
        "code",
        "fileinput",
        "imaplib",
        "operator",
        "profile",
        "site",
        "symtable",
        "traceback",
    ),
}
#: SHA-256 of each split's bytes (CPython 3.11.7's files: 2,067,392 and 222,654 bytes).
SHA256 = {
    "train": "2e54cf2eaac17703f978b038f62f7994107528ab60e7be5f6d66db6381b91e28",
    "validation": "aad1491bd866cfa6ba701b56e6d18e9692cb0b3d9c055eff91f9a0254069911d",
}


def corpus(split: str, *, stdlib: str | None = None) -> bytes:
    """One split's bytes: its files read from `stdlib` (default: this interpreter's) in
    order, checked against the pinned hash.

    Raises:
      ValueError: `split` is not "train" or "validation", or the files differ from the
        pinned corpus (another Python version); the message names the folder and version.
      FileNotFoundError: a listed module is missing from `stdlib`.

    Example:

    >>> data = corpus("validation")
    >>> len(data), data[3:19]
    (222654, b'Stuff to parse A')
    """
    if split not in FILES:
        raise ValueError(
            f"Argument `split` must be one of {tuple(FILES)}. Received: split={split!r}"
        )
    folder = stdlib or sysconfig.get_paths()["stdlib"]
    parts = []
    for name in FILES[split]:
        with open(os.path.join(folder, f"{name}.py"), "rb") as f:
            parts.append(f.read())
    data = b"".join(parts)
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256[split]:
        raise ValueError(
            f"The {split} split of the python_text corpus read from {folder} (Python "
            f"{platform.python_version()}) has SHA-256 {digest}, not the pinned "
            f"{SHA256[split]} (CPython 3.11.7's files): this interpreter's standard library "
            "differs, so its runs would not be comparable with the pinned corpus's."
        )
    return data


def windows(
    data: bytes, *, sequence_length: int = SEQUENCE_LENGTH
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, next-byte labels), each (n, sequence_length) int32, from non-overlapping
    windows of `data` (the label window is the input shifted by one byte).

    Example:

    >>> x, y = windows(b"hello world", sequence_length=5)
    >>> bytes(x[0].astype("uint8")), bytes(y[0].astype("uint8"))
    (b'hello', b'ello ')
    """
    if sequence_length < 1:
        raise ValueError(
            f"Argument `sequence_length` must be >= 1. Received: sequence_length={sequence_length}"
        )
    array = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    n = (len(array) - 1) // sequence_length
    x = array[: n * sequence_length].reshape(n, sequence_length)
    y = array[1 : n * sequence_length + 1].reshape(n, sequence_length)
    return x, y


def load(*, stdlib: str | None = None) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """((x_train, y_train), (x_validation, y_validation)): the pinned corpus as windows.

    Example:

    >>> (x, y), (x_validation, _) = load()
    >>> x.shape, y.shape, x_validation.shape
    ((32302, 64), (32302, 64), (3478, 64))
    """
    return tuple(windows(corpus(split, stdlib=stdlib)) for split in ("train", "validation"))
