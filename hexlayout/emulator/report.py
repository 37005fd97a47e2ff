"""What an emulation run measured: per instruction site and in total.

A *site* is a (source line, origin, instruction kind) triple: all instructions lowered
from one tile op at one line that are of the same kind share a site (instructions without
a source location are sites of their own). Counters:

* ``executions``: dynamic executions by a thread group (one per group per iteration);
  ``warp_executions``: warp-level instances (warps with at least one active thread).
* shared memory: ``smem_wavefronts`` (as the bank model counts them, per warp request),
  ``smem_ideal_wavefronts`` (one per active phase) and ``bank_conflicts`` (the difference).
* global memory: ``gmem_requests`` (warp-level requests), ``gmem_sectors`` (distinct 32-byte
  sectors touched per request, summed) and ``gmem_ideal_sectors`` (the bytes of the distinct
  addresses requested, in 32-byte units rounded up per request), ``gmem_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hexlayout.ir.lowered import Instr

__all__ = ["SiteStats", "EmulatorReport"]


@dataclass
class SiteStats:
    """Counters of one instruction site."""

    instr: Instr
    executions: int = 0
    warp_executions: int = 0
    smem_wavefronts: int = 0
    smem_ideal_wavefronts: int = 0
    gmem_requests: int = 0
    gmem_sectors: int = 0
    gmem_ideal_sectors: int = 0
    gmem_bytes: int = 0

    @property
    def bank_conflicts(self) -> int:
        return self.smem_wavefronts - self.smem_ideal_wavefronts

    @property
    def kind(self) -> str:
        return self.instr.opname

    @property
    def loc(self) -> str:
        return "" if self.instr.loc is None else str(self.instr.loc)

    @property
    def origin(self) -> str:
        return self.instr.origin

    @property
    def sectors_per_request(self) -> float:
        return self.gmem_sectors / self.gmem_requests if self.gmem_requests else 0.0


_COUNTERS = (
    "executions",
    "warp_executions",
    "smem_wavefronts",
    "smem_ideal_wavefronts",
    "gmem_requests",
    "gmem_sectors",
    "gmem_ideal_sectors",
    "gmem_bytes",
)


@dataclass
class EmulatorReport:
    """Per-site statistics (in program order of first execution), blocks run and wall time."""

    kernel: str
    sites: list[SiteStats] = field(default_factory=list)
    blocks: list[tuple[int, ...]] = field(default_factory=list)
    seconds: float = 0.0
    _by_key: dict[object, SiteStats] = field(default_factory=dict, repr=False)
    _by_instr: dict[int, SiteStats] = field(default_factory=dict, repr=False)

    def site(self, instr: Instr) -> SiteStats:
        """The statistics of the site of ``instr`` (created on first use)."""
        s = self._by_instr.get(id(instr))
        if s is not None:
            return s
        key: object = (
            ("loc", instr.loc.file, instr.loc.line, instr.origin, instr.opname)
            if instr.loc is not None
            else ("id", id(instr))
        )
        s = self._by_key.get(key)
        if s is None:
            s = SiteStats(instr)
            self._by_key[key] = s
            self.sites.append(s)
        self._by_instr[id(instr)] = s
        return s

    def find(self, kind: str | None = None, origin: str | None = None) -> list[SiteStats]:
        """Sites of an instruction kind (``"Ldmatrix"``) and / or origin."""
        return [
            s
            for s in self.sites
            if (kind is None or s.kind == kind) and (origin is None or s.origin == origin)
        ]

    def total(self, counter: str) -> int:
        if counter == "bank_conflicts":
            return sum(s.bank_conflicts for s in self.sites)
        return sum(getattr(s, counter) for s in self.sites)

    @property
    def totals(self) -> dict[str, int]:
        out = {c: self.total(c) for c in _COUNTERS}
        out["bank_conflicts"] = self.total("bank_conflicts")
        return out

    def __str__(self) -> str:
        head = (
            "site",
            "origin",
            "instr",
            "execs",
            "warps",
            "smem wf",
            "ideal",
            "confl",
            "g req",
            "sectors",
            "ideal",
        )
        rows = []
        for s in self.sites:
            rows.append(
                (
                    s.loc or "-",
                    s.origin or "-",
                    s.kind,
                    s.executions,
                    s.warp_executions,
                    s.smem_wavefronts,
                    s.smem_ideal_wavefronts,
                    s.bank_conflicts,
                    s.gmem_requests,
                    s.gmem_sectors,
                    s.gmem_ideal_sectors,
                )
            )
        t = self.totals
        rows.append(
            (
                "total",
                "",
                "",
                t["executions"],
                t["warp_executions"],
                t["smem_wavefronts"],
                t["smem_ideal_wavefronts"],
                t["bank_conflicts"],
                t["gmem_requests"],
                t["gmem_sectors"],
                t["gmem_ideal_sectors"],
            )
        )
        cells = [tuple(str(c) for c in head)] + [tuple(str(c) for c in r) for r in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(head))]

        def fmt(r: tuple[str, ...]) -> str:
            return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

        rule = "-" * len(fmt(cells[0]))
        lines = [
            f"emulator report: kernel {self.kernel!r}, {len(self.blocks)} block(s), {self.seconds:.3f} s",
            fmt(cells[0]),
            rule,
        ]
        lines += [fmt(r) for r in cells[1:-1]]
        lines += [rule, fmt(cells[-1])]
        return "\n".join(lines)
