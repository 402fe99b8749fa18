"""A text corpus of Python source that is the same on every Python: generated, pinned.

The language-model config (`configs/text_lm.py`) trains on 100 modules of Python-like
source generated here from a fixed seed, read as bytes (a byte-level model: 256
symbols, no tokenizer). The generator is a small probabilistic grammar of Python
(module docstrings, imports, constants, functions and classes with docstrings,
comments, assignments, conditions, loops, calls, returns) over a fixed vocabulary, and
draws from its own pseudo-random stream (SplitMix64 in integer arithmetic), so the bytes
depend on nothing of the interpreter (an earlier corpus read the interpreter's own
standard library, which differs between patch releases). The corpus is pinned: the
SHA-256 of each split's bytes (its modules concatenated in order); a generator that
gives other bytes is refused with one line instead of silently training on another
corpus. Train and validation are split by module (every tenth module from the sixth is
held out), so the validation loss is measured on modules the model never saw.

Examples are windows of `sequence_length + 1` consecutive bytes, one every
`sequence_length` bytes: the input is the first `sequence_length` bytes, the label of each
position the byte after it.

>>> x, y = windows(b"abcdefgh", sequence_length=3)
>>> x.tolist(), y.tolist()  # "abc" -> "bcd", "def" -> "efg"
([[97, 98, 99], [100, 101, 102]], [[98, 99, 100], [101, 102, 103]])
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import numpy as np

__all__ = [
    "MODULES",
    "SEED",
    "SEQUENCE_LENGTH",
    "SHA256",
    "VOCABULARY",
    "corpus",
    "load",
    "module_source",
    "windows",
]

#: Bytes per example (the model's context).
SEQUENCE_LENGTH = 64
#: Byte-level: every byte value is a symbol.
VOCABULARY = 256
#: The generator's seed and the generated modules, by split (module indices).
SEED = 20261207
MODULES: dict[str, tuple[int, ...]] = {
    "train": tuple(i for i in range(100) if i % 10 != 5),
    "validation": tuple(range(5, 100, 10)),
}
#: SHA-256 of each split's bytes (its modules in order: 2,366,714 and 219,405 bytes).
SHA256 = {
    "train": "2e0620c8444efaa33a974619891533c573adf7605b05f4927c90e69d0a780385",
    "validation": "5e96b3069ee1a1a0e6b57b63d90c0b2a7eff72c1a6a7a97b8a1a1fec13deadd5",
}

_MASK = (1 << 64) - 1


class _Stream:
    """SplitMix64: a pseudo-random stream in integer arithmetic (the same bytes on any
    Python, unlike `random`'s methods, whose algorithms may change between versions)."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def below(self, n: int) -> int:
        """An integer in [0, n)."""
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return (z ^ (z >> 31)) % n

    def pick(self, options: tuple[str, ...]) -> str:
        return options[self.below(len(options))]


_NOUNS = (
    "value",
    "count",
    "index",
    "name",
    "path",
    "size",
    "offset",
    "buffer",
    "item",
    "key",
    "result",
    "total",
    "limit",
    "node",
    "parent",
    "child",
    "token",
    "line",
    "text",
    "data",
    "record",
    "entry",
    "field",
    "state",
    "config",
    "option",
    "message",
    "error",
    "request",
    "response",
    "header",
    "payload",
    "stream",
    "chunk",
    "window",
    "batch",
    "step",
    "rate",
    "weight",
    "score",
    "label",
    "target",
    "source",
    "cache",
    "queue",
    "stack",
    "table",
    "column",
    "row",
    "width",
    "height",
    "depth",
    "level",
    "mode",
    "flag",
    "timeout",
    "delay",
)
_VERBS = (
    "get",
    "set",
    "read",
    "write",
    "parse",
    "format",
    "load",
    "save",
    "build",
    "make",
    "check",
    "update",
    "reset",
    "find",
    "merge",
    "split",
    "join",
    "append",
    "remove",
    "compute",
    "scale",
    "apply",
    "collect",
    "filter",
    "encode",
    "decode",
    "open",
    "close",
)
_ADJECTIVES = (
    "new",
    "old",
    "next",
    "last",
    "first",
    "default",
    "current",
    "local",
    "global",
    "raw",
    "clean",
    "total",
    "max",
    "min",
    "base",
    "extra",
    "inner",
    "outer",
    "short",
    "long",
)
_WORDS = (
    "the",
    "a",
    "of",
    "to",
    "in",
    "is",
    "for",
    "and",
    "or",
    "if",
    "when",
    "each",
    "with",
    "from",
    "as",
    "not",
    "be",
    "this",
    "that",
    "all",
    "one",
    "two",
    "it",
    "its",
    "by",
    "on",
    "return",
    "returns",
    "given",
    "used",
    "must",
    "may",
    "only",
    "before",
    "after",
    "then",
)
_MODULES_IMPORTED = (
    "os",
    "re",
    "sys",
    "json",
    "math",
    "time",
    "struct",
    "string",
    "itertools",
    "functools",
    "collections",
    "logging",
    "pathlib",
    "typing",
    "dataclasses",
    "contextlib",
    "io",
)
_BUILTINS = ("len", "min", "max", "sum", "sorted", "list", "dict", "set", "int", "str", "abs")
_EXCEPTIONS = ("ValueError", "TypeError", "KeyError", "IndexError", "RuntimeError", "OSError")
_OPERATORS = (" + ", " - ", " * ", " // ", " % ", " + ", " - ")
_COMPARISONS = (" < ", " > ", " <= ", " >= ", " == ", " != ", " in ", " not in ")


class _Module:
    """One generated module's text (the grammar's productions as methods)."""

    def __init__(self, index: int) -> None:
        self.rng = _Stream(SEED * 1_000_003 + index)
        self.out: list[str] = []
        self.locals: list[str] = []

    def name(self) -> str:
        rng = self.rng
        kind = rng.below(4)
        if kind == 0:
            return rng.pick(_NOUNS)
        if kind == 1:
            return f"{rng.pick(_ADJECTIVES)}_{rng.pick(_NOUNS)}"
        return f"{rng.pick(_NOUNS)}_{rng.pick(_NOUNS)}" if kind == 2 else rng.pick(_NOUNS) + "s"

    def sentence(self, words: int) -> str:
        text = " ".join(self.rng.pick(_WORDS + _NOUNS + _VERBS) for _ in range(words))
        return text[0].upper() + text[1:]

    def atom(self) -> str:
        rng = self.rng
        kind = rng.below(10)
        if kind < 4 and self.locals:
            return rng.pick(tuple(self.locals))
        if kind < 6:
            return str(rng.below(4) if rng.below(2) else rng.below(1000))
        if kind == 6:
            return f'"{rng.pick(_NOUNS)}"'
        if kind == 7:
            return f"self.{rng.pick(_NOUNS)}"
        return rng.pick(("None", "True", "False", "0", "1", "[]", "{}", '""'))

    def expression(self, depth: int = 0) -> str:
        rng = self.rng
        kind = rng.below(8) if depth < 2 else 0
        if kind <= 2:
            return self.atom()
        if kind <= 4:
            return self.expression(depth + 1) + rng.pick(_OPERATORS) + self.expression(depth + 1)
        if kind == 5:
            return f"{rng.pick(_BUILTINS)}({self.expression(depth + 1)})"
        if kind == 6:
            args = ", ".join(self.expression(depth + 1) for _ in range(rng.below(3)))
            return f"{rng.pick(_VERBS)}_{rng.pick(_NOUNS)}({args})"
        return f"{self.variable()}[{self.expression(depth + 1)}]"

    def variable(self) -> str:
        """A local name, or an attribute of `self`."""
        rng = self.rng
        if self.locals and rng.below(4):
            return rng.pick(tuple(self.locals))
        return f"self.{rng.pick(_NOUNS)}"

    def condition(self) -> str:
        rng = self.rng
        kind = rng.below(6)
        if kind == 0:
            return f"not {self.variable()}"
        if kind == 1:
            return f"{self.variable()} is {rng.pick(('None', 'not None'))}"
        return self.expression(1) + rng.pick(_COMPARISONS) + self.expression(1)

    def line(self, indent: int, text: str) -> None:
        self.out.append("    " * indent + text + "\n")

    def block(self, indent: int, statements: int, depth: int = 0) -> None:
        rng = self.rng
        for _ in range(statements):
            kind = rng.below(12) if depth < 2 else rng.below(6)
            if kind <= 3:
                target = self.name()
                self.line(indent, f"{target} = {self.expression()}")
                self.locals.append(target)
            elif kind == 4:  # a comment, and the statement it is about
                self.line(indent, f"# {self.sentence(3 + rng.below(8)).lower()}")
                self.line(indent, f"{self.name()} = {self.expression()}")
            elif kind == 5:
                self.line(indent, f"{rng.pick(_VERBS)}_{rng.pick(_NOUNS)}({self.expression(1)})")
            elif kind <= 7:
                self.line(indent, f"if {self.condition()}:")
                self.block(indent + 1, 1 + rng.below(3), depth + 1)
                if rng.below(2):
                    self.line(indent, "else:")
                    self.block(indent + 1, 1 + rng.below(2), depth + 1)
            elif kind == 8:
                item = rng.pick(_NOUNS)
                self.line(indent, f"for {item} in {self.expression(1)}:")
                self.locals.append(item)
                self.block(indent + 1, 1 + rng.below(3), depth + 1)
            elif kind == 9:
                self.line(indent, f"while {self.condition()}:")
                self.block(indent + 1, 1 + rng.below(2), depth + 1)
            elif kind == 10:
                message = self.sentence(2 + rng.below(5))
                self.line(indent, f"if {self.condition()}:")
                self.line(
                    indent + 1,
                    f'raise {rng.pick(_EXCEPTIONS)}(f"{message}: {{{self.variable()}!r}}")',
                )
            else:
                self.line(indent, "try:")
                self.block(indent + 1, 1 + rng.below(2), depth + 1)
                self.line(indent, f"except {rng.pick(_EXCEPTIONS)}:")
                self.block(indent + 1, 1, depth + 1)

    def function(self, indent: int, method: bool) -> None:
        rng = self.rng
        params = list(dict.fromkeys(self.name() for _ in range(rng.below(4))))  # distinct
        self.locals = list(params)
        signature = ", ".join((["self"] if method else []) + params)
        self.line(indent, f"def {rng.pick(_VERBS)}_{self.name()}({signature}):")
        if rng.below(3):
            self.line(indent + 1, f'"""{self.sentence(4 + rng.below(10))}."""')
        self.block(indent + 1, 2 + rng.below(6))
        self.line(indent + 1, f"return {self.expression()}")
        self.out.append("\n")

    def source(self) -> bytes:
        rng = self.rng
        self.line(0, f'"""{self.sentence(5 + rng.below(10))}."""')
        self.out.append("\n")
        for _ in range(1 + rng.below(5)):
            self.line(0, f"import {rng.pick(_MODULES_IMPORTED)}")
        self.out.append("\n")
        size = 8_000 + rng.below(32_000)
        length = 0
        while length < size:
            before = len(self.out)
            kind = rng.below(5)
            if kind == 0:
                self.line(0, f"{self.name().upper()} = {self.expression()}")
                self.out.append("\n")
            elif kind <= 2:
                self.function(0, method=False)
                self.out.append("\n")
            else:
                base = rng.pick(("object", "Exception", "dict", "Base")) if rng.below(2) else ""
                title = "".join(part.capitalize() for part in self.name().split("_"))
                self.line(0, f"class {title}({base}):" if base else f"class {title}:")
                self.line(1, f'"""{self.sentence(4 + rng.below(8))}."""')
                self.out.append("\n")
                for _ in range(1 + rng.below(4)):
                    self.function(1, method=True)
                self.out.append("\n")
            length += sum(len(part) for part in self.out[before:])
        return "".join(self.out).encode("ascii")


def module_source(index: int) -> bytes:
    """The generated source of module `index` (the same bytes on every Python).

    >>> module_source(0)[3:40]  # after the module docstring's opening quotes
    b'Config index set join check parent wi'
    """
    return _Module(index).source()


@functools.cache
def _generated(split: str) -> bytes:
    return b"".join(module_source(i) for i in MODULES[split])


def corpus(split: str, *, modules: Callable[[int], bytes] | None = None) -> bytes:
    """One split's bytes: its generated modules in order, checked against the pinned hash.

    `modules` (default: `module_source`) gives a module's bytes by index; another
    source of them must give the pinned bytes.

    Raises:
      ValueError: `split` is not "train" or "validation", or the bytes differ from the
        pinned corpus (one line naming the split and both hashes).

    Example:

    >>> data = corpus("validation")
    >>> len(data), data[3:15]
    (219405, b'Of apply thi')
    """
    if split not in MODULES:
        raise ValueError(
            f"Argument `split` must be one of {tuple(MODULES)}. Received: split={split!r}"
        )
    data = _generated(split) if modules is None else b"".join(map(modules, MODULES[split]))
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256[split]:
        raise ValueError(
            f"The {split} split of the python_text corpus has SHA-256 {digest}, not the "
            f"pinned {SHA256[split]}: its generator gives other bytes than the pinned "
            "corpus, so its runs would not be comparable with the pinned corpus's."
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


def load() -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """((x_train, y_train), (x_validation, y_validation)): the pinned corpus as windows.

    Example:

    >>> (x, y), (x_validation, _) = load()
    >>> x.shape, y.shape, x_validation.shape
    ((36979, 64), (36979, 64), (3428, 64))
    """
    return tuple(windows(corpus(split)) for split in ("train", "validation"))
