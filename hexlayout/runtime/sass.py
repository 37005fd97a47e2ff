"""SASS of a cubin through ``cuobjdump -sass`` (nvidia-cuda-cuobjdump wheel or a toolkit's),
and counts of its instruction opcodes (``HMMA.16816.F32``, ``LDSM.16.M88.4``, ``UTMALDG.2D`` ...)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from .errors import ToolchainError
from .toolchain import INSTALL_HINT, tool_path

__all__ = ["disassemble", "opcode_counts", "count_prefix", "res_usage"]

_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(?P<op>[A-Z][A-Za-z0-9_.]*)")


def _cuobjdump(args: list[str], cubin: bytes) -> str:
    exe = tool_path("cuobjdump")
    if exe is None:
        raise ToolchainError(f"cuobjdump was not found (pip install nvidia-cuda-cuobjdump); {INSTALL_HINT}")
    env = dict(os.environ)
    nvdisasm = tool_path("nvdisasm")          # cuobjdump -sass runs nvdisasm (its own wheel)
    if nvdisasm is not None:
        env["NVDISASM_PATH"] = str(Path(nvdisasm).parent)
        env["PATH"] = str(Path(nvdisasm).parent) + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="hexlayout-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        r = subprocess.run([exe, *args, str(path)], capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise ToolchainError(f"cuobjdump {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def disassemble(cubin: bytes) -> str:
    """The SASS listing of ``cubin``."""
    return _cuobjdump(["-sass"], cubin)


def res_usage(cubin: bytes) -> str:
    """``cuobjdump -res-usage`` of ``cubin``."""
    return _cuobjdump(["-res-usage"], cubin)


def opcode_counts(sass: str) -> Counter[str]:
    """How often each full opcode (with modifiers) occurs in a SASS listing."""
    return Counter(m.group("op") for m in _INSTR.finditer(sass))


def count_prefix(counts: Counter[str], prefix: str) -> int:
    """Instructions whose opcode is ``prefix`` or starts with ``prefix.``."""
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))
