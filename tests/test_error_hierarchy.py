"""Every user-facing error derives from HexlayoutError and keeps the builtin it always was."""

import importlib

import pytest

from hexlayout.errors import HexlayoutError

CASES = [
    ("hexlayout.lang.errors", "KernelError", ValueError),
    ("hexlayout.synth.solve", "SynthesisError", ValueError),
    ("hexlayout.ir.lower.kernel", "LoweringError", ValueError),
    ("hexlayout.codegen.errors", "CodegenError", ValueError),
    ("hexlayout.runtime.args", "ArgumentError", ValueError),
    ("hexlayout.runtime.errors", "CompileError", RuntimeError),
    ("hexlayout.runtime.errors", "ToolchainError", RuntimeError),
    ("hexlayout.runtime.launch", "LaunchError", RuntimeError),
    ("hexlayout.runtime.launch", "UnsupportedDeviceError", RuntimeError),
    ("hexlayout.emulator.errors", "EmulationError", Exception),
    ("hexlayout.emulator.errors", "ArgumentError", ValueError),
    ("hexlayout.cli", "CLIError", Exception),
]


@pytest.mark.parametrize("module,name,builtin", CASES, ids=[c[1] for c in CASES])
def test_error_hierarchy(module: str, name: str, builtin: type) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, HexlayoutError)
    assert issubclass(cls, builtin)


def test_kernel_error_caught_as_both() -> None:
    from hexlayout.lang.errors import KernelError

    with pytest.raises(HexlayoutError, match="k: copy"):
        raise KernelError("k", "copy", None, "shapes differ")
    with pytest.raises(ValueError):
        raise KernelError("k", "copy", None, "shapes differ")
