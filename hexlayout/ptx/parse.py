"""A parser for the PTX that NVRTC emits: module directives, kernel entries with their
``.param`` list, ``.reg`` / ``.shared`` / ``.local`` declarations, labels, guarded
instructions and their operands, and ``.loc`` source positions.

Grammar subset (PTX ISA, "Syntax"):

* statements end with ``;``; ``{`` / ``}`` open and close a scope (inline asm wraps its
  body in one); names declared in a nested scope (``.reg .pred P1;``, labels) are local to
  it and are renamed ``name@<scope>`` so that two inlined copies never collide;
* one-line directives without ``;``: ``.version``, ``.target``, ``.address_size``,
  ``.file``, ``.loc``, ``.maxntid``, ``.reqntid``, ``.minnctapersm``, ``.maxnreg``, ...;
* ``label:`` before a statement; ``@%p`` / ``@!%p`` guards;
* operands: registers ``%r1`` (``%r<703>`` declares ``%r0..%r702``), special registers
  ``%tid.x``, negated predicates ``!%p``, immediates (decimal, ``0x`` hex, ``0f`` / ``0d``
  IEEE bit patterns, floats), symbols (variables, params, labels), vectors ``{%r1, _}``,
  addresses ``[%rd1+16]`` / ``[sym+-8]`` / ``[%r2]``, and ``%p|%q`` destination pairs.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

__all__ = [
    "Reg",
    "Imm",
    "Sym",
    "Vec",
    "Addr",
    "TensorAddr",
    "Pair",
    "Operand",
    "Instruction",
    "Param",
    "VarDecl",
    "Entry",
    "Module",
    "parse_ptx",
    "PtxSyntaxError",
]


class PtxSyntaxError(ValueError):
    """PTX text the parser does not understand; names the PTX line."""

    def __init__(self, line: int, text: str, detail: str) -> None:
        self.line, self.text, self.detail = line, text, detail
        super().__init__(f"PTX line {line}: {detail}: `{text.strip()}`")


@dataclass(frozen=True)
class Reg:
    """A register (``%r1``, ``%tid.x``, a scoped ``P1@3``); ``neg``: written ``!%p``."""

    name: str
    neg: bool = False


@dataclass(frozen=True)
class Imm:
    """An immediate: ``value`` is an int, or a float for ``0f`` / ``0d`` / decimal-point literals
    (``bits`` then holds the IEEE bit pattern of an ``0f`` / ``0d`` literal)."""

    value: int | float
    bits: int | None = None
    width: int = 0


@dataclass(frozen=True)
class Sym:
    """A name: a variable (``smem``), a parameter, or a branch target label."""

    name: str


@dataclass(frozen=True)
class Vec:
    """A vector operand ``{a, b, ...}`` (``None`` for the sink ``_``)."""

    items: tuple


@dataclass(frozen=True)
class Addr:
    """An address ``[base+offset]``: ``base`` a ``Reg``, a ``Sym`` or ``None`` (absolute)."""

    base: Reg | Sym | None
    offset: int


@dataclass(frozen=True)
class TensorAddr:
    """``[map, {c0, c1, ...}]``: a tensor map's address and the coordinates (TMA)."""

    addr: Addr
    coords: Vec


@dataclass(frozen=True)
class Pair:
    """``a|b``: the two destinations of ``setp`` (or ``shfl``'s value and predicate)."""

    first: Reg
    second: Reg


Operand = Reg | Imm | Sym | Vec | Addr | TensorAddr | Pair | None


@dataclass
class Instruction:
    """One PTX instruction: ``opcode`` as written (``ld.global.nc.v4.u32``), its operands, an
    optional guard predicate, the PTX line it is on and the ``.loc`` (file, line) before it."""

    opcode: str
    operands: list[Operand]
    guard: Reg | None
    line: int
    text: str
    loc: tuple[int, int] | None = None

    @property
    def parts(self) -> list[str]:
        return self.opcode.split(".")


@dataclass
class Param:
    """A kernel parameter: ``.param .u64 name`` or ``.param .align A .b8 name[N]``."""

    name: str
    type: str
    nbytes: int
    align: int


@dataclass
class VarDecl:
    """A ``.shared`` / ``.local`` / ``.global`` / ``.const`` variable (``nbytes`` 0: extern)."""

    space: str
    name: str
    type: str
    nbytes: int
    align: int
    extern: bool = False


@dataclass
class Entry:
    """A ``.entry`` (kernel): parameters, register declarations (name -> type), variables,
    instructions and label -> instruction index."""

    name: str
    params: list[Param]
    regs: dict[str, str] = field(default_factory=dict)
    variables: list[VarDecl] = field(default_factory=list)
    body: list[Instruction] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)
    maxntid: tuple[int, ...] | None = None
    cluster: tuple[int, int, int] | None = None  # ``.reqnctapercluster``
    line: int = 0


@dataclass
class Module:
    """A PTX module: ``version``, ``target``, ``files`` (``.file`` index -> name), module-scope
    variables and the entries."""

    version: str = ""
    target: str = ""
    address_size: int = 64
    files: dict[int, str] = field(default_factory=dict)
    variables: list[VarDecl] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)

    def entry(self, name: str | None = None) -> Entry:
        """The entry called ``name`` (default: the only one)."""
        if name is None:
            if len(self.entries) != 1:
                raise KeyError(
                    f"the module has {len(self.entries)} entries; name one of "
                    f"{[e.name for e in self.entries]}"
                )
            return self.entries[0]
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"no entry {name!r}; entries: {[e.name for e in self.entries]}")


_LINE_DIRECTIVES = (
    ".version",
    ".target",
    ".address_size",
    ".file",
    ".loc",
    ".maxntid",
    ".reqntid",
    ".minnctapersm",
    ".maxnctapersm",
    ".maxnreg",
    ".explicitcluster",
    ".reqnctapercluster",
    ".maxclusterrank",
    ".section",
    ".pragma",
)
_LABEL = re.compile(r"^\s*([A-Za-z_$][\w$]*)\s*:(?!:)")
_GUARD = re.compile(r"^@(!?)(%?[\w$]+)\s+")
_OPCODE = re.compile(r"^([a-z][\w.:]*)\s*")
_RANGE = re.compile(r"^(%?[\w$]+)<(\d+)>$")
_TYPES = {
    "pred",
    "b8",
    "b16",
    "b32",
    "b64",
    "b128",
    "u8",
    "u16",
    "u32",
    "u64",
    "s8",
    "s16",
    "s32",
    "s64",
    "f16",
    "f16x2",
    "bf16",
    "bf16x2",
    "f32",
    "f64",
    "tf32",
    "e4m3",
    "e5m2",
}
_TYPE_BYTES = {
    "b8": 1,
    "u8": 1,
    "s8": 1,
    "b16": 2,
    "u16": 2,
    "s16": 2,
    "f16": 2,
    "bf16": 2,
    "b32": 4,
    "u32": 4,
    "s32": 4,
    "f32": 4,
    "f16x2": 4,
    "bf16x2": 4,
    "b64": 8,
    "u64": 8,
    "s64": 8,
    "f64": 8,
    "b128": 16,
    "pred": 1,
}


def _strip_comments(text: str) -> list[str]:
    """The lines of ``text`` with ``//`` and ``/* */`` comments blanked (line count kept)."""
    out, in_block = [], False
    for raw in text.split("\n"):
        if not in_block and "/" not in raw and '"' not in raw:
            out.append(raw)
            continue
        line, i, buf = raw, 0, []
        while i < len(line):
            if in_block:
                j = line.find("*/", i)
                if j < 0:
                    i = len(line)
                    continue
                in_block, i = False, j + 2
                continue
            if line.startswith("//", i):
                break
            if line.startswith("/*", i):
                in_block, i = True, i + 2
                continue
            if line[i] == '"':
                j = line.find('"', i + 1)
                j = len(line) if j < 0 else j + 1
                buf.append(line[i:j])
                i = j
                continue
            buf.append(line[i])
            i += 1
        out.append("".join(buf))
    return out


def _split_top(s: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _int(text: str) -> int:
    t = text.strip().rstrip("Uu")
    neg = t.startswith("-")
    t = t.lstrip("+-")
    if t.lower().startswith("0x"):
        v = int(t[2:], 16)
    elif len(t) > 1 and t.startswith("0") and t.isdigit():
        v = int(t, 8)
    elif t.lower().startswith("0b") and len(t) > 2:
        v = int(t[2:], 2)
    else:
        v = int(t)
    return -v if neg else v


def parse_operand(text: str, line: int = 0) -> Operand:
    """One operand (see the module docstring)."""
    t = text.strip()
    if t == "_":
        return None
    if t.startswith("{") and t.endswith("}"):
        return Vec(tuple(parse_operand(x, line) for x in _split_top(t[1:-1])))
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].replace(" ", "")
        if "," in inner:  # a tensor-map address [map, {coordinates}]
            head, rest = inner.split(",", 1)
            base_op = parse_operand(f"[{head}]", line)
            return TensorAddr(base_op, parse_operand(rest, line))  # type: ignore[arg-type]
        m = re.fullmatch(r"(%?[A-Za-z_$][\w$.@]*)?(?:\+?(-?(?:0[xX][0-9a-fA-F]+|\d+)))?", inner)
        if not m:
            raise PtxSyntaxError(line, text, "an address operand this parser does not read")
        base: Reg | Sym | None = None
        if m.group(1):
            base = Reg(m.group(1)) if m.group(1).startswith("%") else Sym(m.group(1))
        return Addr(base, _int(m.group(2)) if m.group(2) else 0)
    if "|" in t:
        a, b = t.split("|")
        return Pair(Reg(a.strip()), Reg(b.strip()))
    if t.startswith("!"):
        return Reg(t[1:].strip(), neg=True)
    if t.startswith("%"):
        return Reg(t)
    m = re.fullmatch(r"([-+]?)0([fFdD])([0-9a-fA-F]+)", t)
    if m:
        bits = int(m.group(3), 16)
        if m.group(2) in "fF":
            v = struct.unpack("<f", struct.pack("<I", bits))[0]
            width = 32
        else:
            v = struct.unpack("<d", struct.pack("<Q", bits))[0]
            width = 64
        if m.group(1) == "-":
            v, bits = -v, bits ^ (1 << (width - 1))
        return Imm(v, bits, width)
    if re.fullmatch(r"[-+]?(0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)[Uu]?", t):
        return Imm(_int(t))
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", t):
        return Imm(float(t))
    if re.fullmatch(r"[A-Za-z_$][\w$.@]*", t):
        return Sym(t)
    raise PtxSyntaxError(line, text, "an operand this parser does not read")


def _decl(stmt: str, line: int) -> tuple[str, list[tuple[str, int]], int, str]:
    """``.reg/.shared/.local/.param ...`` -> (type, [(name, count or array bytes)], align, space)."""
    toks = stmt.replace(",", " , ").split()
    space = toks[0][1:]
    align, typ, names, extern = 0, "", [], False
    i = 1
    while i < len(toks):
        tk = toks[i]
        if tk == ".align":
            align = int(toks[i + 1])
            i += 2
            continue
        if tk.startswith(".") and tk[1:] in _TYPES:
            typ = tk[1:]
        elif tk.startswith(".") or tk == ",":
            pass
        else:
            names.append(tk)
        i += 1
    out = []
    for n in names:
        m = _RANGE.match(n)
        if m:
            out.append((m.group(1), int(m.group(2))))
            continue
        m = re.fullmatch(r"([\w$%]+)\[(\d*)\]", n)
        if m:
            cnt = int(m.group(2)) if m.group(2) else 0
            out.append((m.group(1), cnt * _TYPE_BYTES.get(typ, 1)))
            continue
        out.append((n, -1))
    if not typ:
        raise PtxSyntaxError(line, stmt, "a declaration without a type")
    _ = extern
    return typ, out, align, space


class _Scopes:
    """Nested ``{ }`` scopes of one entry: names declared in each, resolved after parsing."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {0: -1}
        self.names: dict[int, set[str]] = {0: set()}
        self.stack = [0]

    def open(self) -> None:
        s = len(self.parent)
        self.parent[s] = self.stack[-1]
        self.names[s] = set()
        self.stack.append(s)

    def close(self) -> None:
        self.stack.pop()

    @property
    def cur(self) -> int:
        return self.stack[-1]

    def declare(self, name: str) -> str:
        self.names[self.cur].add(name)
        return name if self.cur == 0 else f"{name}@{self.cur}"

    def resolve(self, name: str, scope: int) -> str:
        s = scope
        while s > 0:
            if name in self.names[s]:
                return f"{name}@{s}"
            s = self.parent[s]
        return name


def _rename(op: Operand, scope: int, sc: _Scopes, regs: dict[str, str]) -> Operand:
    """``op`` with scoped names resolved; a plain name that is a declared register (inline
    asm may declare ``.reg .b32 c;``) becomes a ``Reg``."""
    if isinstance(op, Reg):
        return Reg(sc.resolve(op.name, scope), op.neg)
    if isinstance(op, Sym):
        name = sc.resolve(op.name, scope)
        return Reg(name) if name in regs else Sym(name)
    if isinstance(op, Vec):
        return Vec(tuple(_rename(x, scope, sc, regs) for x in op.items))
    if isinstance(op, Addr):
        base = _rename(op.base, scope, sc, regs) if op.base is not None else None
        return Addr(base, op.offset)  # type: ignore[arg-type]
    if isinstance(op, TensorAddr):
        return TensorAddr(_rename(op.addr, scope, sc, regs), _rename(op.coords, scope, sc, regs))  # type: ignore[arg-type]
    if isinstance(op, Pair):
        return Pair(_rename(op.first, scope, sc, regs), _rename(op.second, scope, sc, regs))  # type: ignore[arg-type]
    return op


def _params(header: str, line: int) -> tuple[str, list[Param]]:
    m = re.search(r"\.entry\s+([\w$]+)\s*\((.*)\)\s*$", header, re.S)
    if not m:
        m2 = re.search(r"\.entry\s+([\w$]+)\s*$", header, re.S)
        if not m2:
            raise PtxSyntaxError(line, header, "an entry header this parser does not read")
        return m2.group(1), []
    params = []
    for p in _split_top(m.group(2)):
        typ, names, align, _ = _decl(p, line)
        for n, cnt in names:
            nbytes = cnt if cnt >= 0 else _TYPE_BYTES.get(typ, 8)
            params.append(Param(n, typ, nbytes, align or _TYPE_BYTES.get(typ, 1)))
    return m.group(1), params


def parse_ptx(text: str) -> Module:
    """Parse a PTX module (the subset NVRTC emits for hexlayout kernels)."""
    return _Parser(text).run()


class _Parser:
    """One pass over the lines of a PTX module: entry headers, one-line directives, and the
    characters of the body, cut into statements at ``;`` and scope braces."""

    def __init__(self, text: str) -> None:
        self.mod = Module()
        self.lines = _strip_comments(text)
        self.entry: Entry | None = None
        self.scopes = _Scopes()
        self.pending: list[tuple[Instruction, int]] = []
        self.loc: tuple[int, int] | None = None
        self.buf, self.buf_line, self.depth = "", 0, 0
        self.inlined: dict[tuple[int, int], tuple[int, int]] = {}
        self.i = 0

    def run(self) -> Module:
        lines = self.lines
        while self.i < len(lines):
            ln, st = self.i + 1, lines[self.i].strip()
            self.i += 1
            if not st:
                continue
            words = st.rstrip(";").split()
            if self.entry is None and (".entry" in words or ".func" in words):
                self._entry_header(st, ln)
            elif words[0] == ".section" and self.entry is None:
                while self.i < len(lines) and "}" not in lines[self.i]:  # debug sections: data, not code
                    self.i += 1
                self.i += 1
            elif words[0] in _LINE_DIRECTIVES and not self.buf.strip():
                self._line_directive(st, words)
            else:
                self._characters(lines[self.i - 1], ln)
        if self.entry is not None:
            raise PtxSyntaxError(len(lines), "", f"entry {self.entry.name} is not closed")
        return self.mod

    def _entry_header(self, st: str, ln: int) -> None:
        """``.entry name(params) directives {``: the header may span lines up to its brace."""
        head = [st]
        while not head[-1].endswith("{") and self.i < len(self.lines):
            head.append(self.lines[self.i].strip())
            self.i += 1
        joined = " ".join(head)[:-1]
        close = joined.rfind(")")
        name, params = _params(joined[: close + 1] if close >= 0 else joined.split(".maxntid")[0], ln)
        entry = Entry(name, params, line=ln)
        mt = re.search(r"\.(?:maxntid|reqntid)\s+([\d ,]+)", joined)
        if mt:
            entry.maxntid = tuple(int(x) for x in mt.group(1).replace(",", " ").split())
        mc = re.search(r"\.reqnctapercluster\s+([\d ,]+)", joined)
        if mc:
            dims = [int(x) for x in mc.group(1).replace(",", " ").split()]
            entry.cluster = tuple((dims + [1, 1, 1])[:3])  # type: ignore[assignment]
        self.mod.entries.append(entry)
        self.entry = entry
        self.scopes, self.pending, self.depth = _Scopes(), [], 1

    def _line_directive(self, st: str, words: list[str]) -> None:
        mod = self.mod
        if words[0] == ".version":
            mod.version = words[1]
        elif words[0] == ".target":
            mod.target = words[1].rstrip(",")
        elif words[0] == ".address_size":
            mod.address_size = int(words[1])
        elif words[0] == ".file":
            mod.files[int(words[1])] = st.split('"')[1] if '"' in st else words[2]
        elif words[0] == ".loc":
            here = (int(words[1]), int(words[2].rstrip(",")))
            at = st.split("inlined_at")
            if len(at) > 1:  # an inlined function's line: the kernel file's line it was inlined at
                w = at[-1].replace(",", " ").split()
                outer = (int(w[0]), int(w[1]))
                self.inlined[here] = self.inlined.get(outer, outer)
            self.loc = self.inlined.get(here, here)

    def _flush(self, ln: int) -> None:
        if self.buf.strip():
            self._statement(self.buf, self.buf_line or ln)
        self.buf, self.buf_line = "", 0

    def _characters(self, line: str, ln: int) -> None:
        """A body line: statements end at ``;``; ``{`` / ``}`` open and close scopes (the entry's
        closing brace finishes it)."""
        for ch in line:
            if ch == ";":
                self._statement(self.buf, self.buf_line or ln)
                self.buf, self.buf_line = "", 0
            elif ch == "{" and not _LABEL.sub("", self.buf).strip():
                self._flush(ln)
                self.scopes.open()
                self.depth += 1
            elif ch == "}" and self.buf.count("{") <= self.buf.count("}"):
                self._flush(ln)
                self.depth -= 1
                if self.depth == 0 and self.entry is not None:
                    _finish(self.entry, self.scopes, self.pending)
                    self.entry = None
                else:
                    self.scopes.close()
            else:
                if not self.buf.strip() and not ch.isspace():
                    self.buf_line = ln
                self.buf += ch
        m = _LABEL.match(self.buf)
        if m and not self.buf[m.end() :].strip():
            self._statement(self.buf, self.buf_line or ln)
            self.buf, self.buf_line = "", 0
        elif self.buf.strip():
            self.buf += " "

    def _statement(self, stmt: str, ln: int) -> None:
        s = stmt.strip()
        entry = self.entry
        while entry is not None:
            m = _LABEL.match(s)
            if not m:
                break
            entry.labels[self.scopes.declare(m.group(1))] = len(entry.body)
            s = s[m.end() :].strip()
        if not s:
            return
        if s.startswith("."):
            self._declaration(s, ln)
            return
        if entry is None:
            raise PtxSyntaxError(ln, s, "an instruction outside an entry")
        guard = None
        m = _GUARD.match(s)
        if m:
            guard = Reg(m.group(2), neg=bool(m.group(1)))
            s = s[m.end() :]
        m = _OPCODE.match(s)
        if not m:
            raise PtxSyntaxError(ln, stmt, "not an instruction")
        ops = [parse_operand(o, ln) for o in _split_top(s[m.end() :])]
        ins = Instruction(m.group(1), ops, guard, ln, s, self.loc)
        self.pending.append((ins, self.scopes.cur))
        entry.body.append(ins)

    def _declaration(self, s: str, ln: int) -> None:
        """``.reg`` (registers, ``%r<n>`` ranges) and ``.shared`` / ``.local`` / ``.global`` /
        ``.const`` variables; other directives have nothing to execute (.pragma, linkage, ...)."""
        words = s.split()
        if not any(w in words for w in (".reg", ".shared", ".local", ".global", ".const")):
            return
        extern = ".extern" in words
        plain = " ".join(w for w in words if w not in (".extern", ".visible", ".weak"))
        typ, names, align, space = _decl(plain, ln)
        entry = self.entry
        for n, cnt in names:
            if space == "reg":
                if entry is None:
                    raise PtxSyntaxError(ln, s, "a .reg declaration outside an entry")
                if cnt >= 0:
                    for k in range(cnt):
                        entry.regs[self.scopes.declare(f"{n}{k}")] = typ
                else:
                    entry.regs[self.scopes.declare(n)] = typ
            else:
                v = VarDecl(space, n, typ, cnt if cnt >= 0 else _TYPE_BYTES.get(typ, 1),
                            align or _TYPE_BYTES.get(typ, 1), extern)
                (entry.variables if entry is not None else self.mod.variables).append(v)


def _finish(entry: Entry, scopes: _Scopes, pending: list[tuple[Instruction, int]]) -> None:
    """Resolve scoped names now that every scope's declarations (labels included) are known."""
    for ins, scope in pending:
        if scope or any(isinstance(o, (Sym, Addr, Vec)) for o in ins.operands):
            ins.operands = [_rename(o, scope, scopes, entry.regs) for o in ins.operands]
            if ins.guard is not None:
                ins.guard = _rename(ins.guard, scope, scopes, entry.regs)  # type: ignore[assignment]
