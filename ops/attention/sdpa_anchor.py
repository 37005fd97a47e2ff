"""The attention anchor of post-scheduling fusion: ``scaled_dot_product_attention`` as one
FlashAttention-2-style forward kernel in the tile language, for f16 and bf16, with an
optional attention mask, top-left causal masking and grouped-query heads.

``o[b, i, h, :] = sum_j p_ij v[b, j, h // (H // KVH), :]`` with
``p_i = softmax_j(t_ij)``, ``t_ij = scale * q[b, i, h, :] . k[b, j, h // (H // KVH), :]
(+ mask[b, h, i, j])`` over the keys ``j`` the row sees: ``j < Sk``; with ``CAUSAL``
``j <= i`` (torch's ``is_causal``: the mask aligned top-left, for any ``Sq`` and ``Sk``);
with a boolean mask where ``mask[b, h, i, j]`` is true; with a mask computed from the
positions (``mask_fn(i, j)``: Mistral's sliding window ``i - W < j <= i``), where it is true
or adding its value; the key blocks outside the bounds ``i + lo <= j <= i + hi`` such a mask
implies (``mask_fn.key_bounds()``) are not visited. Tensors are ``[B, S, heads, D]``;
the mask ``[MB, MH, Sq, Sk]`` with ``MB`` in ``{1, B}`` and ``MH`` in ``{1, H}`` (a mode of
1 broadcasts: the kernel reads index ``min(b, MB - 1)``). A row with no visible key gives
zeros (torch gives NaN there).

Each block owns ``BM`` query rows of one (batch, head): ``q`` is kept in registers; ``BN``-row
blocks of ``k`` and ``v`` stream through two shared buffers (cp.async, the next block loads
while this one is used); ``S = Q K^T`` (mma), the scores scaled into the log2 domain
(``qk_scale = scale * log2(e)``, an additive mask times ``log2(e)``), masked, the online
softmax's row max ``m_i`` and sum ``l_i`` in f32 registers, and ``P V`` accumulated with
``P`` (cast to the input type) as the A operand. ``HEAD_DIM`` is the padded head size
(views read past ``D`` as zeros). ``sdpa_fusion`` registers it as the attention anchor record
of ``hexlayout.fusion``.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the factory.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32

__all__ = ["sdpa_kernel", "sdpa_anchor", "sdpa_consts", "MASKS"]

B, Sq, Sk, H, KVH, D, MB, MH = hl.dims("B Sq Sk H KVH D MB MH")

#: the mask kinds: none, a boolean mask (read as bytes), an additive mask of the input type,
#: a mask computed from the query and key positions (``index_mask.IndexMask``)
MASKS = ("none", "bool", "add", "index")
_NEG_INF = float("-inf")
_LOG2E = 1.4426950408889634


def _attend(q: Any, k: Any, v: Any, o: Any, mask: Any, qk_scale: Any, dt: DType, kind: str, epilogue: Any,
            *, BM: int, BN: int, HEAD_DIM: int, CAUSAL: bool, mask_fn: Any = None) -> None:
    """The kernel body (traced inside ``sdpa_kernel``'s kernels; see the module docstring)."""
    nb, nq, nh, _ = q.shape
    nk = k.shape[1]
    nkvh = k.shape[2]
    pid_b, pid_h, pid_m = hl.grid(hl.spatial(nb, nh, hl.cdiv(nq, BM)))
    kvh = pid_h // (nh // nkvh)
    m0 = pid_m * BM
    n_end = hl.minimum(nk, m0 + BM) if CAUSAL else nk     # top-left: row i sees keys j <= i
    lo, hi = mask_fn.key_bounds() if mask_fn is not None else (None, None)
    if hi is not None:                    # a mask of positions: rows i < m0 + BM see keys j <= i + hi
        n_end = hl.minimum(nk, hl.maximum(m0 + (BM + hi), 0))
    num_kv = hl.cdiv(n_end, BN)
    j0 = 0 if lo is None else hl.maximum(m0 + lo, 0) // BN      # ... and keys j >= i + lo
    if kind in ("bool", "add"):
        mb = hl.minimum(pid_b, mask.shape[0] - 1)
        mh = hl.minimum(pid_h, mask.shape[1] - 1)

    sq = hl.shared(dt, (BM, HEAD_DIM))
    sk = hl.shared(dt, (BN, HEAD_DIM, 2))
    sv = hl.shared(dt, (BN, HEAD_DIM, 2))
    hl.copy(q.tile((1, BM, 1, HEAD_DIM), (pid_b, m0, pid_h, 0))[0, :, 0, :], sq)
    hl.commit_group()
    hl.copy(k.tile((1, BN, 1, HEAD_DIM), (pid_b, j0 * BN, kvh, 0))[0, :, 0, :], sk[:, :, j0 % 2])
    hl.copy(v.tile((1, BN, 1, HEAD_DIM), (pid_b, j0 * BN, kvh, 0))[0, :, 0, :], sv[:, :, j0 % 2])
    hl.commit_group()

    sm = hl.OnlineSoftmax(BM)
    acc = hl.zeros((BM, HEAD_DIM), f32)
    hl.wait_group(1)                      # q has landed (k / v block 0 may still be in flight)
    hl.syncthreads()
    rq = hl.register(dt, (BM, HEAD_DIM))
    hl.copy(sq, rq)
    for j in hl.range(j0, num_kv):
        buf = j % 2
        nxt = (j + 1) % 2
        hl.wait_group(0)                  # block j has landed; every warp is done with buffer nxt
        hl.syncthreads()
        n1 = (j + 1) * BN
        hl.copy(k.tile((1, BN, 1, HEAD_DIM), (pid_b, n1, kvh, 0))[0, :, 0, :], sk[:, :, nxt])
        hl.copy(v.tile((1, BN, 1, HEAD_DIM), (pid_b, n1, kvh, 0))[0, :, 0, :], sv[:, :, nxt])
        hl.commit_group()

        s = hl.zeros((BM, BN), f32)
        rk = hl.register(dt, (BN, HEAD_DIM))
        hl.copy(sk[:, :, buf], rk)
        hl.mma(rq, rk, s)
        t = s * qk_scale                  # log2 domain
        cols = hl.iota((BM, BN), 1) + j * BN
        valid = cols < nk
        if CAUSAL:
            valid = valid & (cols <= hl.iota((BM, BN), 0) + m0)
        if kind == "bool":
            mt = hl.register(hl.u8, (BM, BN))
            hl.copy(mask.tile((1, 1, BM, BN), (mb, mh, m0, j * BN))[0, 0, :, :], mt)
            valid = valid & mt.ne(0)
        elif kind == "add":
            mt = hl.register(dt, (BM, BN))
            hl.copy(mask.tile((1, 1, BM, BN), (mb, mh, m0, j * BN))[0, 0, :, :], mt)
            t = t + hl.cast(mt, f32) * _LOG2E
        elif kind == "index":                     # the mask computed from the positions
            mv = mask_fn(hl.iota((BM, BN), 0) + m0, cols)
            if mask_fn.boolean:
                valid = valid & mv
            else:
                t = t + mv * _LOG2E
        t = hl.where(valid, t, _NEG_INF)

        p = sm.step(t, acc, rescale_first=True)   # t is in the log2 domain already
        rv = hl.register(dt, (HEAD_DIM, BN))
        hl.copy(sv[:, :, buf].T, rv)
        hl.mma(hl.cast(p, dt), rv, acc)

    hl.wait_group(0)
    out = sm.out(acc)
    if epilogue is not None:              # elementwise math of the output (f32), in the store
        out = epilogue(out)
    hl.copy(hl.cast(out, o.dtype), o.tile((1, BM, 1, HEAD_DIM), (pid_b, m0, pid_h, 0))[0, :, 0, :])


@cache
def sdpa_kernel(dtype: DType, mask: str = "none", mask_align: int = 16, epilogue: Any = None,
                out_dtype: DType | None = None, mask_fn: Any = None) -> Any:
    """The attention kernel for ``dtype`` (f16 / bf16) and ``mask`` (``MASKS``; the mask's rows
    ``mask_align``-byte aligned): parameters ``q``, ``k``, ``v``, ``o`` (``[B, S, heads, D]``,
    of ``out_dtype``, default ``dtype``), then ``mask`` (``[MB, MH, Sq, Sk]``: u8 for
    ``"bool"``, ``dtype`` for ``"add"``) unless ``"none"``, then ``qk_scale``
    (``scale * log2(e)``); constants ``BM``, ``BN``, ``HEAD_DIM``, ``CAUSAL``, ``WARPS``.
    ``epilogue`` (hashable; traced on the f32 output tile, returns a tile): elementwise math
    before the store. ``mask="index"``: no mask parameter; ``mask_fn`` (hashable, an
    ``index_mask.IndexMask``) computes the mask from the tiles of query and key positions."""
    if mask not in MASKS:
        raise ValueError(f"hexlayout sdpa: mask must be one of {MASKS}, not {mask!r}")
    if str(dtype) not in ("f16", "bf16"):
        raise ValueError(f"hexlayout sdpa: dtype must be f16 or bf16, not {dtype}")
    dt = dtype
    odt = out_dtype or dtype
    threads = lambda c: 32 * c["WARPS"]  # noqa: E731
    if (mask == "index") != (mask_fn is not None):
        raise ValueError("hexlayout sdpa: mask='index' takes a mask_fn (and only it does)")
    name = f"sdpa_{dt}" + ("" if mask == "none" else f"_{mask}_mask")
    name += "" if epilogue is None else "_epilogue"

    if mask in ("none", "index"):
        @hl.kernel(threads=threads, name=name)
        def sdpa(q: dt[B, Sq, H, D], k: dt[B, Sk, KVH, D], v: dt[B, Sk, KVH, D],  # type: ignore
                 o: odt[B, Sq, H, D], qk_scale: f32, *, BM: int = 64, BN: int = 64,  # type: ignore
                 HEAD_DIM: int = 128, CAUSAL: bool = False, WARPS: int = 4):
            _attend(q, k, v, o, None, qk_scale, dt, mask, epilogue, BM=BM, BN=BN, HEAD_DIM=HEAD_DIM,
                    CAUSAL=CAUSAL, mask_fn=mask_fn)
        return sdpa

    mdt = hl.u8 if mask == "bool" else dt

    @hl.kernel(threads=threads, name=name)
    def sdpa_masked(q: dt[B, Sq, H, D], k: dt[B, Sk, KVH, D], v: dt[B, Sk, KVH, D],  # type: ignore
                    o: odt[B, Sq, H, D], mask: mdt[MB, MH, Sq, Sk].aligned(mask_align),  # type: ignore
                    qk_scale: f32, *, BM: int = 64, BN: int = 64, HEAD_DIM: int = 128,
                    CAUSAL: bool = False, WARPS: int = 4):
        _attend(q, k, v, o, mask, qk_scale, dt, "bool" if mdt is hl.u8 else "add", epilogue, BM=BM, BN=BN,
                HEAD_DIM=HEAD_DIM, CAUSAL=CAUSAL)
    return sdpa_masked


def sdpa_anchor(dtype: DType, mask: str = "none", mask_align: int = 16, epilogue: Any = None,
                out_dtype: DType | None = None, mask_fn: Any = None) -> Any:
    """The anchor kernel (``hexlayout.fusion``'s attention provider): ``sdpa_kernel``."""
    return sdpa_kernel(dtype, mask, mask_align, epilogue, out_dtype, mask_fn)


def sdpa_consts(sq: int, sk: int, d: int, causal: bool, emulated: bool) -> dict[str, Any]:
    """Tile constants: ``HEAD_DIM`` the power of two ``>= d`` (at least 16); on a GPU 64 query
    rows and 64 keys a block over 4 warps (16 rows a warp); in the emulator one warp of 16
    rows and 16 keys (small and quick)."""
    hd = 16
    while hd < d:
        hd *= 2
    if not emulated:
        return {"BM": 64, "BN": 64 if hd <= 64 else 32, "HEAD_DIM": hd, "WARPS": 4, "CAUSAL": causal}
    return {"BM": 16, "BN": 16, "HEAD_DIM": hd, "WARPS": 1, "CAUSAL": causal}
