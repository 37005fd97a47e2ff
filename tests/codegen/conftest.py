"""Fixtures for the CUDA backend tests.

Tests marked ``nvrtc`` / ``nvcc`` need that compiler and fail (never skip) where it is
missing: CI has nvcc on PATH and installs the ``cuda`` extra (cuda-bindings,
nvidia-cuda-nvrtc, nvidia-cuda-runtime headers, nvidia-cuda-cuobjdump for SASS).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "nvrtc: compiles with NVRTC (cuda-bindings); fails when it is missing")
    config.addinivalue_line("markers", "nvcc: compiles with nvcc; fails when it is missing")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``HEXLAYOUT_CACHE_DIR`` and an empty in-process memo."""
    from hexlayout.runtime import clear_memory_cache

    d = tmp_path / "cache"
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(d))
    clear_memory_cache()
    yield d
    clear_memory_cache()
