"""The memory roofline shared by the benchmark scripts: a device's peak HBM bandwidth, and the
error of a measured output against its reference.

``peak_gbps(device, override)`` is the first ``PEAK_GBPS`` entry whose key is a substring of
the device name (GB/s; ``override`` wins when given; ``None`` for an unknown device). A kernel
moving ``b`` bytes in ``t`` ms reaches ``b / t / 1e6`` GB/s, its roofline fraction that over the
peak. ``max_rel_err(out, ref) = max|out - ref| / max|ref|``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PEAK_GBPS", "peak_gbps", "max_rel_err"]

#: HBM peak bandwidth in GB/s by device-name substring (first match wins).
PEAK_GBPS = [
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),
    ("H800", 3350.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    ("L40S", 864.0),
    ("L4", 300.0),
    ("RTX 4090", 1008.0),
    ("A10", 600.0),
]


def peak_gbps(device: str, override: float | None) -> float | None:
    """The peak HBM bandwidth of ``device`` in GB/s (``override`` when given)."""
    if override:
        return override
    for key, v in PEAK_GBPS:
        if key in device:
            return v
    return None


def max_rel_err(out: Any, ref: Any) -> float:
    """``max |out - ref| / max |ref|`` over tensors of one shape, in float64."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    return ((out.double() - ref.double()).abs().max() / (ref.double().abs().max() + 1e-6)).item()
