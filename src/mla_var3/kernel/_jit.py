"""In-kernel helpers shared by every design: operand casts for the interpreter and the
online-softmax step. All scores are in the log2 domain (``scale * log2(e)`` folded into the
score), so ``exp2`` is the only transcendental.
"""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# constexpr copies for use inside @triton.jit code (plain module floats do not compile for a GPU)
LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)


@triton.jit
def operand(x, UPCAST: tl.constexpr):
    """A dot/arithmetic operand: float32 under the interpreter (which computes garbage on raw
    bf16 bits), the storage dtype on the GPU (tensor cores)."""
    if UPCAST:
        return x.to(tl.float32)
    else:
        return x


@triton.jit
def online_softmax_step(scores, m_i, l_i):
    """One block of the online softmax.

    scores : [M, N] float32, log2 domain, masked entries = -inf.
    m_i, l_i : [M] float32 running max (log2 domain) and running sum.

    Returns ``p`` [M, N] (unnormalised probabilities against the new max), ``alpha`` [M] (the
    factor that rescales the old accumulator and sum), and the new ``m_i``, ``l_i``. Rows whose
    scores are all -inf so far keep m = -inf and contribute p = 0 without producing NaN.
    """
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def finalize_lse(m_i, l_i):
    """Natural-log LSE of the scaled scores from the log2-domain running max and sum.
    Rows that saw no key get -inf."""
    return tl.where(l_i > 0, (m_i + tl.log2(l_i)) * LN2_C, float("-inf"))


@triton.jit
def to_storage(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """Cast float32 ``x`` to the storage ``dtype`` with the GPU's rounding (nearest even).

    The interpreter truncates fp32 -> bf16; under ``UPCAST`` the value is rounded to nearest even
    on its bits first, so the cast is exact and interpreter results carry the GPU's (unbiased)
    rounding error instead of a systematic downward bias. On the GPU this is a plain cast.
    """
    if UPCAST and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def split_key_range(n_keys, first_limit, ROWS: tl.constexpr, CAUSAL: tl.constexpr, pid_split,
                    NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's keys among ``[0, n_keys)``, for ``ROWS`` query tokens whose first sees keys
    ``<= first_limit`` under the causal mask (each next token one more). Returns
    ``(lo, hi, n_full)``: ``[lo, hi)`` is this split's part of the keys some row sees, cut into
    ``NUM_SPLITS`` ranges of whole ``BLOCK_N`` blocks; ``n_full`` (keys every row sees) is
    rounded down to a block, so blocks below it need no mask."""
    if CAUSAL:
        hi = tl.minimum(n_keys, first_limit + ROWS)
        n_full = tl.minimum(n_keys, first_limit + 1)
    else:
        hi = n_keys
        n_full = n_keys
    hi = tl.maximum(hi, 0)
    n_full = (tl.maximum(n_full, 0) // BLOCK_N) * BLOCK_N
    if NUM_SPLITS > 1:
        per_split = tl.cdiv(tl.cdiv(hi, BLOCK_N), NUM_SPLITS) * BLOCK_N
        lo = pid_split * per_split
        hi = tl.minimum(hi, lo + per_split)
    else:
        lo = 0
    return lo, hi, n_full
