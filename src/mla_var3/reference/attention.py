"""fp32 references of the three MLA designs and the stages around them.

Every function takes the seed's layouts, computes in float32 (float64 when any input is
float64), and returns float32/float64 results. Attention functions return ``(out, lse)`` where
``lse`` [B, H, S] is the natural-log log-sum-exp of the *scaled* scores.

Causal rule: query i (0-based among the s new tokens) of a sequence with L valid keys sees keys
``j <= L - s + i`` (the s new tokens are the last s of the L keys). ``seqlens`` [B] gives L per
sequence (default T); keys ``j >= L`` are never seen.

The comments state each step's memory traffic in elements (w bytes each on the GPU), so the cost
model of ``mla_var3.analysis.cost`` shows in the code.
"""

from __future__ import annotations

import torch

from mla_var3._values import check_length_dtype, check_scale


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype)


def key_mask(b: int, s: int, t: int, causal: bool, seqlens: torch.Tensor | None, device) -> torch.Tensor:
    """Boolean visibility mask [B, 1, S, T]: True where query i may see key j."""
    j = torch.arange(t, device=device)
    i = torch.arange(s, device=device)
    lengths = torch.full((b,), t, device=device, dtype=torch.long) if seqlens is None else seqlens.to(device).long()
    length = lengths[:, None, None]                                      # [B, 1, 1]
    visible = j[None, None, :] < length                                  # [B, 1, T]
    if causal:
        visible = visible & (j[None, None, :] <= length - s + i[None, :, None])  # [B, S, T]
    return visible.expand(b, s, t)[:, None]


def _zero_past(x: torch.Tensor, seqlens: torch.Tensor | None) -> torch.Tensor:
    """Zero the keys/values of x [B, T, ...] at positions >= seqlens[b] (they may hold anything,
    NaN included, and must not reach the output through 0 * NaN)."""
    if seqlens is None:
        return x
    t = x.shape[1]
    valid = torch.arange(t, device=x.device)[None, :] < seqlens.to(x.device).long()[:, None]
    return torch.where(valid.view(*valid.shape, *([1] * (x.dim() - 2))), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _softmax_with_lse(scores: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax over the last dim; rows with no visible key give p = 0 and lse = -inf."""
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                # [B, H, S]
    p = torch.exp(scores - lse[..., None].masked_fill(torch.isinf(lse)[..., None], 0.0))
    return p.nan_to_num(0.0), lse


def flash_attention(q, qpe, k, v, kpe, scale: float, causal: bool = True, seqlens=None):
    """Expanded attention (design 1): K, V materialised per head, one RoPE key per token.

    q [B,H,S,D], qpe [B,H,S,P], k, v [B,T,H,D], kpe [B,T,P] -> (o [B,H,S,D], lse [B,H,S]).
    """
    scale = check_scale(scale)
    if seqlens is not None:
        check_length_dtype("seqlens", seqlens)
    cd = _compute_dtype(q, qpe, k, v, kpe)
    k, v, kpe = (_zero_past(x, seqlens) for x in (k, v, kpe))
    b, h, s, _ = q.shape
    t = k.shape[1]
    # read q, qpe (bhs(d+p)), k (bthd), kpe (btp); bhst scores of 2(d+p) FLOPs each
    scores = torch.einsum("bhsd,bthd->bhst", _up(q, cd), _up(k, cd))
    scores = scores + torch.einsum("bhsp,btp->bhst", _up(qpe, cd), _up(kpe, cd))
    p, lse = _softmax_with_lse(scores * scale, key_mask(b, s, t, causal, seqlens, q.device))
    # read v (bthd); write o (bhsd); 2d FLOPs per score
    o = torch.einsum("bhst,bthd->bhsd", p, _up(v, cd))
    return o, lse


def flash_mla(qc, qpe, z, kpe, scale: float, causal: bool = True, seqlens=None):
    """Absorbed attention (design 2) over the latent cache; all heads share one read of Z.

    qc [B,H,S,K], qpe [B,H,S,P], z [B,T,K], kpe [B,T,P] -> (o_latent [B,H,S,K], lse [B,H,S]).
    Rows with no visible key get o = 0 and lse = -inf; a sequence of length 0 (``seqlens[b] = 0``)
    gets lse = +inf, as official FlashMLA reports it.
    """
    scale = check_scale(scale)
    if seqlens is not None:
        check_length_dtype("seqlens", seqlens)
    cd = _compute_dtype(qc, qpe, z, kpe)
    z, kpe = _zero_past(z, seqlens), _zero_past(kpe, seqlens)
    b, h, s, _ = qc.shape
    t = z.shape[1]
    # read qc, qpe (bhs(k+p)), z and kpe once (bt(k+p)); 2(k+p) FLOPs per score
    scores = torch.einsum("bhsk,btk->bhst", _up(qc, cd), _up(z, cd))
    scores = scores + torch.einsum("bhsp,btp->bhst", _up(qpe, cd), _up(kpe, cd))
    p, lse = _softmax_with_lse(scores * scale, key_mask(b, s, t, causal, seqlens, qc.device))
    # z is the value too; write o_latent (bhsk); 2k FLOPs per score
    o_latent = torch.einsum("bhst,btk->bhsk", p, _up(z, cd))
    if seqlens is not None:  # an empty sequence: LSE +inf (FlashMLA's convention), output 0
        lse = lse.masked_fill((seqlens.to(lse.device) == 0).view(b, 1, 1), float("inf"))
    return o_latent, lse


def gather_paged(kv_cache: torch.Tensor, block_table: torch.Tensor, seqlens: torch.Tensor):
    """Dense views of a paged latent cache.

    kv_cache [num_blocks, page_block_size, 1, K+P], block_table [B, max_blocks] int32,
    seqlens [B] -> kv [B, max_blocks * page_block_size, K+P] (keys past seqlens[b] hold whatever
    the table points at; mask them with ``seqlens``).
    """
    nb, pbs, one, width = kv_cache.shape
    if one != 1:
        raise ValueError(f"kv_cache must be [num_blocks, page_block_size, 1, K+P], got {list(kv_cache.shape)}")
    b, max_blocks = block_table.shape
    blocks = block_table.long().clamp(0, nb - 1)                          # unused entries may be -1
    return kv_cache[:, :, 0][blocks].reshape(b, max_blocks * pbs, width)


def flash_mla_paged(qc, qpe, kv_cache, block_table, seqlens, scale: float, causal: bool = True):
    """Absorbed attention over a paged latent cache (FlashMLA's layout).

    qc [B,H,S,K], qpe [B,H,S,P], kv_cache [num_blocks, page_block_size, 1, K+P] (first K latent,
    last P RoPE key), block_table [B, max_blocks] int32, seqlens [B] -> (o_latent, lse).
    """
    k = qc.shape[-1]
    kv = gather_paged(kv_cache, block_table, seqlens)
    return flash_mla(qc, qpe, kv[..., :k], kv[..., k:], scale, causal, seqlens)


def mla_var6_plus(q, qpe, qc, z_old, kpe, k_new, v_new, scale: float, causal: bool = True):
    """The hybrid, ``mla_var6_plus`` (design 3): O old tokens latent, N newest expanded, one softmax over O+N.

    q [B,H,S,D], qpe [B,H,S,P], qc [B,H,S,K], z_old [B,O,K], kpe [B,O+N,P],
    k_new, v_new [B,N,H,D] -> (o [B,H,S,D], o_latent [B,H,S,K], lse [B,H,S]).
    Both parts are normalised by the one softmax: the attention output is
    ``o + decompress(o_latent, w_uv)``.
    """
    scale = check_scale(scale)
    cd = _compute_dtype(q, qpe, qc, z_old, kpe, k_new, v_new)
    b, h, s, _ = q.shape
    n_old, n_new = z_old.shape[1], k_new.shape[1]
    kpe_c = _up(kpe, cd)
    # latent part: read qc, z_old (bok); 2(k+p) FLOPs per score
    s_old = torch.einsum("bhsk,bok->bhso", _up(qc, cd), _up(z_old, cd))
    s_old = s_old + torch.einsum("bhsp,bop->bhso", _up(qpe, cd), kpe_c[:, :n_old])
    # expanded part: read q, k_new (bhnd); 2(d+p) FLOPs per score
    s_new = torch.einsum("bhsd,bnhd->bhsn", _up(q, cd), _up(k_new, cd))
    s_new = s_new + torch.einsum("bhsp,bnp->bhsn", _up(qpe, cd), kpe_c[:, n_old:])
    scores = torch.cat([s_old, s_new], dim=-1) * scale
    p, lse = _softmax_with_lse(scores, key_mask(b, s, n_old + n_new, causal, None, q.device))
    # write o_latent (bhsk) from z_old and o (bhsd) from v_new (bhnd read)
    o_latent = torch.einsum("bhso,bok->bhsk", p[..., :n_old], _up(z_old, cd))
    o = torch.einsum("bhsn,bnhd->bhsd", p[..., n_old:], _up(v_new, cd))
    return o, o_latent, lse


def decompress(o_latent, w_uv, o=None):
    """Output decompression: o_latent [B,H,S,K] x w_uv [H,K,D] (+ o [B,H,S,D]) -> [B,H,S,D].

    Reads bhsk + hkd (+ bhsd), writes bhsd; 2bhskd FLOPs.
    """
    cd = _compute_dtype(o_latent, w_uv, o)
    out = torch.einsum("bhsk,hkd->bhsd", _up(o_latent, cd), _up(w_uv, cd))
    return out if o is None else out + _up(o, cd)


def absorb_query(q_nope, w_uk):
    """Query absorption: q_nope [B,H,S,D] x w_uk [H,D,K] -> qc [B,H,S,K].

    Reads bhsd + hdk, writes bhsk; 2bhsdk FLOPs.
    """
    cd = _compute_dtype(q_nope, w_uk)
    return torch.einsum("bhsd,hdk->bhsk", _up(q_nope, cd), _up(w_uk, cd))


def expand_kv(z, w_uk, w_uv):
    """Expanded K, V per head from the latent cache: z [B,T,K] -> (k, v) each [B,T,H,D].

    ``k[b,t,h] = w_uk[h] @ z[b,t]`` and ``v[b,t,h] = z[b,t] @ w_uv[h]``, with w_uk [H,D,K] and
    w_uv [H,K,D] (the per-head blocks of ``kv_b_proj``).
    """
    cd = _compute_dtype(z, w_uk, w_uv)
    k = torch.einsum("btk,hdk->bthd", _up(z, cd), _up(w_uk, cd))
    v = torch.einsum("btk,hkd->bthd", _up(z, cd), _up(w_uv, cd))
    return k, v
