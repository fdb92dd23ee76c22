"""Seeded random inputs: for every design at once, consistent across designs, and for each
kernel launcher alone.

One :class:`MLAInputs` holds the tensors of all three designs for the same tokens and weights:
the expanded K/V are built from the latent Z through the per-head up-projections and the
absorbed query from the no-RoPE query, so all designs compute the same attention (up to the
rounding of the storage dtype). Values are O(1) so the softmax is neither flat nor one-hot.

>>> from mla_var3.shapes import MLADims, Problem
>>> x = make_inputs(MLADims(h=4, d=16, p=16, k=32), Problem(b=2, s=3, t=10, n=4))
>>> x.qc.shape, x.z_old.shape, x.k_new.shape
(torch.Size([2, 4, 3, 32]), torch.Size([2, 6, 32]), torch.Size([2, 4, 4, 16]))

:func:`design_inputs` draws the keyword arguments of one launcher by name (what the benchmark,
the calibration, the baselines and ``python -m mla_var3.kernel`` time and check): each launcher
gets only its own tensors, drawn on the device, fast at benchmark sizes.

>>> y = design_inputs("flash_mla", MLADims(h=2, d=8, p=4, k=16), Problem(b=1, s=2, t=8), device="cpu")
>>> tuple(y["z"].shape), y["z"].dtype
((1, 8, 16), torch.bfloat16)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mla_var3.reference.attention import absorb_query, expand_kv
from mla_var3.shapes import MLADims, Problem


@dataclass(frozen=True)
class MLAInputs:
    """Tensors of one attention call, in the seed's layouts.

    q [B,H,S,D], qpe [B,H,S,P], qc [B,H,S,K], z [B,T,K], kpe [B,T,P], k, v [B,T,H,D],
    w_uk [H,D,K], w_uv [H,K,D]; ``scale`` is the softmax scale; ``o`` the hybrid's latent count
    (``z_old``, ``k_new``, ``v_new`` slice the cache at it).
    """

    q: torch.Tensor
    qpe: torch.Tensor
    qc: torch.Tensor
    z: torch.Tensor
    kpe: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    scale: float
    o: int

    @property
    def z_old(self) -> torch.Tensor:
        return self.z[:, : self.o]

    @property
    def k_new(self) -> torch.Tensor:
        return self.k[:, self.o :]

    @property
    def v_new(self) -> torch.Tensor:
        return self.v[:, self.o :]


def make_inputs(dims: MLADims, problem: Problem, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", seed: int = 0) -> MLAInputs:
    """Random inputs for ``problem`` at ``dims``, stored in ``dtype`` on ``device``.

    Derived tensors (qc, k, v) are computed in float32 from the stored (rounded) q, z and
    weights, then stored in ``dtype``.
    """
    b, s, t = problem.b, problem.s, problem.t
    h, d, p, k = dims.h, dims.d, dims.p, dims.k
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen) * std).to(dtype)

    q = randn(b, h, s, d)
    qpe = randn(b, h, s, p)
    z = randn(b, t, k)
    kpe = randn(b, t, p)
    # up-projections scaled so that expanded k, v entries are O(1)
    w_uk = randn(h, d, k, std=k**-0.5)
    w_uv = randn(h, k, d, std=k**-0.5)
    qc = absorb_query(q, w_uk).to(dtype)
    k_exp, v_exp = expand_kv(z, w_uk, w_uv)
    to = dict(device=device)
    return MLAInputs(
        q=q.to(**to), qpe=qpe.to(**to), qc=qc.to(**to), z=z.to(**to), kpe=kpe.to(**to),
        k=k_exp.to(dtype).to(**to), v=v_exp.to(dtype).to(**to), w_uk=w_uk.to(**to), w_uv=w_uv.to(**to),
        scale=dims.default_scale, o=problem.o,
    )


def make_paged(z: torch.Tensor, kpe: torch.Tensor, seqlens: torch.Tensor, *, page_block_size: int = 64,
               extra_blocks: int = 3, seed: int = 0):
    """Scatter a dense latent cache into a shuffled paged cache (FlashMLA's layout).

    z [B,T,K], kpe [B,T,P], seqlens [B] -> (kv_cache [num_blocks, page_block_size, 1, K+P],
    block_table [B, max_blocks] int32). Blocks are assigned in a random order, with
    ``extra_blocks`` unused NaN-filled blocks mixed in, so a kernel that ignores the table or
    reads past a sequence's last valid block sees wrong values or NaN. Table entries past a
    sequence's blocks are -1.
    """
    b, t, k = z.shape
    width = k + kpe.shape[-1]
    max_blocks = -(-t // page_block_size)
    used = [-(-int(n) // page_block_size) for n in seqlens.tolist()]
    num_blocks = sum(used) + extra_blocks
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    cache = torch.full((num_blocks, page_block_size, 1, width), float("nan"), dtype=z.dtype, device=z.device)
    table = torch.full((b, max_blocks), -1, dtype=torch.int32)
    dense = torch.cat([z, kpe], dim=-1)
    nxt = 0
    for i in range(b):
        for j in range(used[i]):
            blk = order[nxt]
            nxt += 1
            table[i, j] = blk
            lo, hi = j * page_block_size, min((j + 1) * page_block_size, int(seqlens[i]))
            cache[blk, : hi - lo, 0] = dense[i, lo:hi]
    return cache, table.to(z.device)


# --------------------------------------------------------------------------------------------
# one launcher's inputs, by name

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``"bf16"``, ``"fp16"`` or ``"fp32"``; ValueError naming them otherwise."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(TORCH_DTYPES)}") from None


def design_inputs(name: str, dims: MLADims, problem: Problem, *, dtype: str = "bf16", device="cuda",
                  seed: int = 0) -> dict:
    """Random keyword arguments for launcher ``name`` in the public layouts (scale included).

    Values are N(0, 1) drawn on ``device`` (fast at benchmark sizes), the absorbed query scaled
    by ``k**-0.25`` and the weights by the inverse square root of their input width:
    ``flash_attention`` q [b,h,s,d], qpe [b,h,s,p], k [b,t,h,d], v [b,t,h,dv], kpe [b,t,p];
    ``flash_mla`` qc [b,h,s,k], qpe, z [b,t,k], kpe; ``mla_var6_plus`` q, qpe, qc,
    z_old [b,t-n,k], kpe, k_new [b,n,h,d], v_new [b,n,h,dv]; ``absorb_query`` q_nope [b,h,s,d],
    w_uk [h,d,k]; ``decompress`` o_latent [b,h,s,k], w_uv [h,k,dv].
    """
    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    d, p, k, dv = dims.d, dims.p, dims.k, dims.dv
    dt = torch_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, std=1.0):
        x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
        return (x * std).to(dt)

    scale = dims.default_scale
    if name == "flash_attention":
        return dict(q=randn(b, h, s, d), qpe=randn(b, h, s, p), k=randn(b, t, h, d), v=randn(b, t, h, dv),
                    kpe=randn(b, t, p), scale=scale, causal=problem.causal)
    if name == "flash_mla":
        return dict(qc=randn(b, h, s, k, std=k**-0.25), qpe=randn(b, h, s, p), z=randn(b, t, k), kpe=randn(b, t, p),
                    scale=scale, causal=problem.causal)
    if name == "mla_var6_plus":
        n = problem.n or 0
        return dict(q=randn(b, h, s, d), qpe=randn(b, h, s, p), qc=randn(b, h, s, k, std=k**-0.25),
                    z_old=randn(b, t - n, k), kpe=randn(b, t, p), k_new=randn(b, n, h, d), v_new=randn(b, n, h, dv),
                    scale=scale, causal=problem.causal)
    if name == "absorb_query":
        return dict(q_nope=randn(b, h, s, d), w_uk=randn(h, d, k, std=d**-0.5))
    if name == "decompress":
        return dict(o_latent=randn(b, h, s, k), w_uv=randn(h, k, dv, std=k**-0.5))
    raise ValueError(f"no inputs known for {name!r}")
