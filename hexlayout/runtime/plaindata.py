"""Plain-data serialization of hexlayout object graphs: JSON plus raw byte blobs, never code.

``encode(obj) -> (json_bytes, blobs)`` and ``decode(json_bytes, blobs) -> obj`` persist the
object graph of a ``Build`` (tile program, synthesis, lowered program, generated source,
compiled cubin) without ``pickle``. Reading a document can only create

- JSON scalars (``None``, ``bool``, ``int``, ``float``, ``str``), ``bytes`` (from ``blobs``),
  ``tuple``, ``list``, ``dict``, ``set``, ``frozenset``;
- instances of classes defined in ``hexlayout`` modules, by ``object.__new__`` (or
  ``str.__new__`` / ``int.__new__`` / ``float.__new__`` for subclasses of those) and filling
  ``__dict__`` / ``__slots__`` with decoded values (no ``__init__``, ``__new__`` override,
  ``__setstate__`` or ``__reduce__`` of theirs runs), ``tuple`` subclasses (named tuples) by
  ``tuple.__new__``, and members of ``hexlayout`` enums by value.

Class names are resolved only inside the ``hexlayout`` package (``module:qualname``; the
module must be ``hexlayout`` or ``hexlayout.*``, already loaded or in one of the data-model
packages (never ``__main__`` or the command line), the attribute a class defined there), so a
document cannot name ``os.system`` or any other callable: unlike ``pickle``, decoding
executes no code chosen by the file. Shared and cyclic references are kept (objects are
numbered in a table). Anything else (functions, foreign classes) makes ``encode`` raise
``TypeError``; any malformed document makes ``decode`` raise ``ValueError``.
"""

from __future__ import annotations

import enum
import functools
import gc
import importlib
import json
import sys
from typing import Any

__all__ = ["encode", "decode", "FORMAT"]

#: Version of the document layout below.
FORMAT = 1

_SCALARS = (str, int, float, bool, type(None))


@functools.cache
def _slots(cls: type) -> tuple[str, ...]:
    """The slot names of ``cls`` and its bases (once per class)."""
    out: list[str] = []
    for c in cls.__mro__:
        for s in c.__dict__.get("__slots__", ()):
            if s not in ("__dict__", "__weakref__") and s not in out:
                out.append(s)
    return tuple(out)


def _class_ok(cls: type) -> bool:
    mod = getattr(cls, "__module__", "") or ""
    return (mod == "hexlayout" or mod.startswith("hexlayout.")) and "<locals>" not in cls.__qualname__


class _Encoder:
    def __init__(self) -> None:
        self.table: list[Any] = []
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []          # keeps encoded objects alive so their ids stay unique
        self.classes: list[str] = []
        self.class_ix: dict[type, int] = {}
        self.blobs: list[bytes] = []

    def cls(self, cls: type) -> int:
        ix = self.class_ix.get(cls)
        if ix is None:
            if not _class_ok(cls):
                raise TypeError(f"cannot persist an instance of {cls.__module__}.{cls.__qualname__} "
                                "(only hexlayout classes are stored)")
            ix = self.class_ix[cls] = len(self.classes)
            self.classes.append(f"{cls.__module__}:{cls.__qualname__}")
        return ix

    def value(self, x: Any) -> Any:
        t = type(x)
        if t in _SCALARS:
            if t is float and x != x:
                return ["nan"]
            if t is float and x in (float("inf"), float("-inf")):
                return ["inf", x > 0]
            return x
        ix = self.memo.get(id(x))
        if ix is not None:
            return ["r", ix]
        if t is bytes or t is bytearray:
            self.blobs.append(bytes(x))
            return ["b", len(self.blobs) - 1]
        if isinstance(x, enum.Enum):
            return ["e", self.cls(t), self.value(x.value)]
        if isinstance(x, type):
            return ["c", self.cls(x)]
        ix = len(self.table)
        self.memo[id(x)] = ix
        self.keep.append(x)
        self.table.append(None)
        if t is tuple:
            rec: list[Any] = ["t", [self.value(v) for v in x]]
        elif t is list:
            rec = ["l", [self.value(v) for v in x]]
        elif t is dict:
            rec = ["d", [[self.value(k), self.value(v)] for k, v in x.items()]]
        elif t is set or t is frozenset:
            rec = ["s" if t is set else "f", [self.value(v) for v in x]]
        elif isinstance(x, tuple):
            rec = ["n", self.cls(t), [self.value(v) for v in x]]
        elif isinstance(x, (str, int, float)) and not isinstance(x, bool):
            base = next(b for b in (str, int, float) if isinstance(x, b))
            rec = ["p", self.cls(t), base(x), *self.state(x, t)]
        else:
            rec = ["o", self.cls(t), *self.state(x, t)]
        self.table[ix] = rec
        return ["r", ix]

    def state(self, x: Any, t: type) -> list[Any]:
        """``[fields, slots]`` of an instance: its ``__dict__`` items and its slot values."""
        d = getattr(x, "__dict__", None)
        fields = [[k, self.value(v)] for k, v in d.items()] if d is not None else []
        return [fields, [[s, self.value(getattr(x, s))] for s in _slots(t) if hasattr(x, s)]]


def encode(obj: Any) -> tuple[bytes, list[bytes]]:
    """``(document, blobs)``: the JSON document of ``obj``'s graph and its ``bytes`` values."""
    gc_was = gc.isenabled()
    gc.disable()                  # many small records, no garbage: collection would only cost time
    try:
        enc = _Encoder()
        root = enc.value(obj)
        doc = {"format": FORMAT, "classes": enc.classes, "table": enc.table, "root": root}
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode(), enc.blobs
    finally:
        if gc_was:
            gc.enable()


#: Packages whose modules a document may cause to be imported (data model only: never the
#: command line, ``__main__`` or the pictures); other hexlayout modules must already be loaded.
_IMPORTABLE = ("hexlayout.arch.", "hexlayout.ir.", "hexlayout.layout.", "hexlayout.synth.",
               "hexlayout.codegen.", "hexlayout.runtime.", "hexlayout.lang.", "hexlayout.emulator.",
               "hexlayout.fusion.")


def _resolve(name: Any) -> type:
    if not isinstance(name, str) or name.count(":") != 1:
        raise ValueError(f"bad class name {name!r}")
    mod, qual = name.split(":")
    if not (mod == "hexlayout" or mod.startswith("hexlayout.")) or "<" in qual or "__main__" in mod:
        raise ValueError(f"class {name!r} is outside hexlayout")
    obj: Any = sys.modules.get(mod)
    if obj is None:
        if not (mod + ".").startswith(_IMPORTABLE):
            raise ValueError(f"class {name!r}: module {mod} is not loaded and not in hexlayout's data model")
        try:
            obj = importlib.import_module(mod)
        except ImportError as e:
            raise ValueError(f"class {name!r}: {e}") from None
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or obj.__module__ != mod or obj.__qualname__ != qual:
        raise ValueError(f"{name!r} is not a hexlayout class")
    return obj


class _Decoder:
    def __init__(self, doc: dict[str, Any], blobs: list[bytes]) -> None:
        self.classes = [_resolve(c) for c in doc["classes"]]
        self.table = doc["table"]
        if not isinstance(self.table, list):
            raise ValueError("table is not a list")
        self.done: dict[int, Any] = {}
        self.blobs = blobs

    def cls(self, ix: Any) -> type:
        if type(ix) is not int or not 0 <= ix < len(self.classes):
            raise ValueError(f"bad class index {ix!r}")
        return self.classes[ix]

    def value(self, v: Any) -> Any:
        if type(v) in _SCALARS:
            return v
        if type(v) is not list or not v:
            raise ValueError(f"bad value {v!r:.80}")
        tag = v[0]
        if tag == "r":
            return self.ref(v[1])
        if tag == "b":
            ix = v[1]
            if type(ix) is not int or not 0 <= ix < len(self.blobs):
                raise ValueError(f"bad blob index {ix!r}")
            return self.blobs[ix]
        if tag == "e":
            cls = self.cls(v[1])
            if not issubclass(cls, enum.Enum):
                raise ValueError(f"{cls.__qualname__} is not an enum")
            return cls(self.value(v[2]))
        if tag == "c":
            return self.cls(v[1])
        if tag == "nan":
            return float("nan")
        if tag == "inf":
            return float("inf") if v[1] else float("-inf")
        raise ValueError(f"bad tag {tag!r}")

    def ref(self, ix: Any) -> Any:
        if type(ix) is not int or not 0 <= ix < len(self.table):
            raise ValueError(f"bad reference {ix!r}")
        if ix in self.done:
            out = self.done[ix]
            if out is _BUSY:
                raise ValueError("a cycle runs through an immutable container")
            return out
        rec = self.table[ix]
        if type(rec) is not list or len(rec) < 2:
            raise ValueError(f"bad record {ix}")
        tag = rec[0]
        if tag == "o" or tag == "p":
            cls = self.cls(rec[1])
            if issubclass(cls, (enum.Enum, tuple, BaseException, bool)):
                raise ValueError(f"{cls.__qualname__} cannot be restored field by field")
            if tag == "o":
                if cls.__new__ is not object.__new__:
                    raise ValueError(f"{cls.__qualname__} cannot be restored field by field")
                obj = object.__new__(cls)
            else:
                base = next((b for b in (str, int, float) if issubclass(cls, b)), None)
                if base is None or type(rec[2]) is not base:
                    raise ValueError(f"{cls.__qualname__} is not a str, int or float type of that value")
                obj = base.__new__(cls, rec[2])
            self.done[ix] = obj
            fields, slots = rec[-2], rec[-1]
            if fields:
                d = obj.__dict__
                for k, val in fields:
                    if type(k) is not str:
                        raise ValueError("bad field name")
                    d[k] = self.value(val)
            allowed = _slots(cls)
            for k, val in slots:
                if k not in allowed:
                    raise ValueError(f"{cls.__qualname__} has no slot {k!r}")
                object.__setattr__(obj, k, self.value(val))
            return obj
        items = rec[1] if tag != "n" else rec[2]
        if type(items) is not list:
            raise ValueError(f"bad record {ix}")
        if tag == "l":
            out_l: list[Any] = []
            self.done[ix] = out_l
            out_l.extend(self.value(x) for x in items)
            return out_l
        if tag == "d":
            out_d: dict[Any, Any] = {}
            self.done[ix] = out_d
            for pair in items:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("bad dict item")
                out_d[self.value(pair[0])] = self.value(pair[1])
            return out_d
        if tag == "s":
            out_s: set[Any] = set()
            self.done[ix] = out_s
            out_s.update(self.value(x) for x in items)
            return out_s
        self.done[ix] = _BUSY
        vals = [self.value(x) for x in items]
        if tag == "t":
            out: Any = tuple(vals)
        elif tag == "f":
            out = frozenset(vals)
        elif tag == "n":
            cls = self.cls(rec[1])
            if not issubclass(cls, tuple):
                raise ValueError(f"{cls.__qualname__} is not a tuple type")
            out = tuple.__new__(cls, vals)
        else:
            raise ValueError(f"bad record tag {tag!r}")
        self.done[ix] = out
        return out


_BUSY = object()


def decode(document: bytes, blobs: list[bytes]) -> Any:
    """The object graph of ``document`` (see the module docstring); ``ValueError`` when malformed."""
    gc_was = gc.isenabled()
    gc.disable()                  # many small objects, no garbage: collection would only cost time
    try:
        doc = json.loads(document)
        if type(doc) is not dict or doc.get("format") != FORMAT:
            raise ValueError("not a hexlayout plain-data document of this format")
        dec = _Decoder(doc, blobs)
        return dec.value(doc["root"])
    except (KeyError, TypeError, AttributeError, IndexError, RecursionError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed document: {type(e).__name__}: {e}") from None
    finally:
        if gc_was:
            gc.enable()
