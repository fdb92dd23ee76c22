"""The hybrid (``mla_var6_plus``) on Hopper (sm_90): the latent part on the absorbed design's kernel, the
expanded part on the device's best expanded kernel or, on an SM partition, the Gluon window
kernel; the parts on two streams, merged by :mod:`mla_var3.kernel.hybrid`'s merge kernel.

The ``"gluon"`` backend of ``mla_var6_plus`` (opt-in: measured on an H200 no split beat the
absorbed kernel alone; docs/kernels/mla-var6-plus/design.md, "Changes, predictions, outcomes", and
docs/kernels/mla-var6-plus/partition.md).

Example
-------
>>> o, o_latent, lse = mla_var6_plus_hopper(q, qpe, qc, z_old, kpe, k_new, v_new, scale=192 ** -0.5,
...                                         expanded_programs=44)   # doctest: +SKIP
"""

from __future__ import annotations

import torch

from mla_var3.kernel import backends
from mla_var3.kernel import expanded as _fa
from mla_var3.kernel._common import cuda_index, num_sms
from mla_var3.kernel.absorbed import flash_mla
from mla_var3.kernel.hopper import window_gluon as wg
from mla_var3.kernel.hybrid import expanded_persistent, merge_parts, mla_var6_plus_portable

__all__ = ["CHECKED_WIDTHS", "default_programs", "gluon_latent_applies", "mla_var6_plus_hopper"]

#: (K, P) of the calls the Hopper path takes: the widths its kernels were checked at end to end on
#: an H200 (DeepSeek's; the seesaw latent kernel takes no other). Other widths run the portable path.
CHECKED_WIDTHS = frozenset({(512, 64)})
#: SM-time of the window kernel at b = 32, h = 128 on an H200, fitted over n = 64-2,048 and
#: s = 1-32 on 44 programs (results/h200/window/items-cb4f406.json; docs/kernels/mla-var6-plus/
#: window.md, "What a window item costs"): WINDOW_US[0] + WINDOW_US[1] * s per window key (29.6
#: at s = 1, 32.1 at s = 16, 34.8 at s = 32) plus WINDOW_ITEM_US[0] + WINDOW_ITEM_US[1] * s per
#: (sequence, head) item (its queries, its first block's ring fill, the hand-over and the store:
#: 1.1-2.4 SM-us, what 40-80 keys cost; an item of one block costs 2.0-3.3), and the seesaw latent
#: kernel ~ LATENT_US_PER_TOKEN * s per key (31.6 and 65.4 at s = 16 and 32)
WINDOW_US = (29.4, 0.17)
WINDOW_ITEM_US = (1.0, 0.044)
LATENT_US_PER_TOKEN = 2.0
#: programs the window gets beyond the balance of the parts' costs: an under-sized window is the
#: long pole (its programs are persistent), while the latent programs take every SM the window
#: frees (measured on an H200: the best of 22-124 programs was 9-29 above the balance)
PARTITION_MARGIN = 12
#: the (sequence, head) items of the batch the per-key costs above are measured at (b = 32, h = 128)
_B32_ITEMS = 32 * 128
#: the largest s the default partitions at: measured on an H200 (b = 32, t = 4,096) the partition
#: beat the two streams at s = 16 and 32 (1,134.8 against 1,309.9 us; 2,101.7 against 2,277.8) and
#: lost at s = 64 (4,233-7,252 against 3,111.6-3,930.4 us: the window kernel's one-stage ring there)
PARTITION_MAX_S = 32


def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    """A side stream for the latent part of a call without the caller's
    :class:`~mla_var3.kernel.hybrid.HybridDecode`: from torch's per-device stream pool, the next
    of its 32 streams at every call (no stream is created or kept here; a CUDA graph records the
    fork and the join, not the stream)."""
    return torch.cuda.Stream(device=cuda_index(device))


def gluon_latent_applies(dtype: torch.dtype, k: int, p: int, s: int, o_len: int, n_len: int, causal: bool,
                         config) -> bool:
    """Whether the Hopper path takes the call: the Gluon kernel's limits (bf16/fp16, K a
    multiple of 64 in [64, 512], P a multiple of 16 up to 256), no portable ``config`` asked
    for, at least one old token, and a latent part the Gluon kernel can express:

    * N = 0: the whole call is the absorbed kernel over T = O keys (its own causal rule);
    * N >= S (or not causal): query i sees old key j iff j <= O + N - S + i, which holds for
      every j < O — the latent part is *non-causal* over the O old keys (and the Gluon
      kernel needs S <= O for that);
    * 0 < N < S and causal: the mask reaches into the old keys with an offset the absorbed
      kernel cannot express (its rule is j <= O - S + i); the portable path takes it.
    """
    if dtype not in (torch.bfloat16, torch.float16) or config is not None or o_len == 0:
        return False
    if k % 64 or not 64 <= k <= 512 or p % 16 or not 0 < p <= 256:
        return False
    if n_len == 0:
        return True
    return o_len >= s and (n_len >= s or not causal)


def default_programs(s: int, o_len: int, n_len: int, sms: int) -> int:
    """The window's programs in an SM partition: those that balance the window part (N keys and
    the items on them) and the latent part (O keys on the other SMs) by their measured SM-time
    (:data:`WINDOW_US` per key and :data:`WINDOW_ITEM_US` per item, :data:`LATENT_US_PER_TOKEN`;
    all scale with b alike), plus :data:`PARTITION_MARGIN`. Measured on an H200 at b = 32, t = 4,096 with the window kernel of
    4a26139 (results/h200/hybrid/partition-4a26139.json; µs with the decompression, window programs
    22-66): s = 16, N = 1,024 -> 46 (44: 1,197.9, the default call 1,209.6); s = 32, N = 2,048 -> 63
    (66: 2,024.8, 44: 2,224.4, the default 2,044.2); N = 3,072 -> 80 (66: 2,191.9, the default
    2,042.9)."""
    window = (WINDOW_US[0] + WINDOW_US[1] * s) * n_len + _B32_ITEMS * (WINDOW_ITEM_US[0] + WINDOW_ITEM_US[1] * s)
    latent = LATENT_US_PER_TOKEN * s * o_len
    share = window / max(window + latent, 1e-9)
    return max(8, min(sms - 8, round(sms * share) + PARTITION_MARGIN))


def mla_var6_plus_hopper(q, qpe, qc, z_old, kpe, k_new, v_new, *, scale: float, causal: bool = True, config=None,
                         out=None, out_latent=None, overlap: bool = True, streams=None,
                         expanded_programs: int | None | str = "auto", window_kernel: str = "gluon",
                         window_block: tuple[int, int] | None = None, decode=None):
    """The sm_90 backend of :func:`mla_var6_plus` (inputs already validated; ``out`` and
    ``out_latent`` may be None).

    Where :func:`gluon_latent_applies` holds, the latent part runs on the public
    :func:`mla_var3.kernel.absorbed.flash_mla` over the O old keys, non-causal (the seesaw kernel
    at DeepSeek's widths, through the entry's fast path) and the expanded part on
    the expanded attention over the N newest keys (the public
    :func:`mla_var3.kernel.expanded.flash_attention`, so the device's best expanded backend; its
    output in the input dtype); :func:`merge_partials`' kernel merges them.
    With ``overlap`` the two parts are issued on two streams (latent on a side stream, expanded
    on the current one, or on ``streams = (latent_stream, expanded_stream)``), joined before
    the merge, so the compute-bound and memory-bound parts may run at the same time.
    ``expanded_programs="auto"`` (the default) takes an SM partition of :func:`default_programs`
    programs where the Gluon window kernel applies and ``s <= PARTITION_MAX_S`` (else the two
    streams: ``None``). With
    ``expanded_programs`` an int, the expanded part is :func:`expanded_persistent` on that many programs,
    issued *before* the latent part: it holds that many SMs and the latent part (one
    shared-memory-filling program per SM) takes the others — an SM partition. The persistent
    expanded part is the Gluon window kernel (:func:`mla_var3.kernel.hopper.window_gluon.
    expanded_window_gluon`, built to pull the window's bytes from few SMs; ``window_block`` =
    (keys per block, ring depth), default its ``choose_block``) where it applies and
    ``window_kernel == "gluon"``, else the portable :func:`expanded_persistent`. Otherwise the
    portable backend runs. Only :data:`CHECKED_WIDTHS` take this path; with no old key (O = 0,
    N >= S) it is the expanded kernel alone (the device's best), the latent output zero.

    The latent kernel returns its partial in the input dtype (one extra rounding of ``o_l``
    before the merge, within the dtype's tolerance) and reads ``z_old`` and ``kpe[:, :O]`` in
    place where TMA can address them.

    ``decode``: the caller's :class:`~mla_var3.kernel.hybrid.HybridDecode` — the latent part
    runs on its :class:`~mla_var3.kernel.decode.AbsorbedDecode` and the side stream is its own;
    without one the latent part makes its state per call and the side stream comes from torch's
    pool at every call.
    """
    b, h, s, d = q.shape
    k, p, o_len, n_len = qc.shape[-1], qpe.shape[-1], z_old.shape[1], k_new.shape[1]
    dev = q.device
    checked = (k, p) in CHECKED_WIDTHS and config is None and b * h * s > 0
    if checked and o_len == 0 and n_len >= s and q.dtype in (torch.bfloat16, torch.float16):
        # the expanded design itself: the device's best expanded kernel, a zero latent output
        o, lse = _fa.flash_attention(q, qpe, k_new, v_new, kpe, scale=scale, causal=causal)
        out = o if out is None else out.copy_(o)
        out_latent = (torch.zeros((b, h, s, k), dtype=q.dtype, device=dev) if out_latent is None
                      else out_latent.zero_())
        return out, out_latent, lse
    if not checked or not gluon_latent_applies(q.dtype, k, p, s, o_len, n_len, causal, config):
        return mla_var6_plus_portable(q, qpe, qc, z_old, kpe, k_new, v_new, scale=scale, causal=causal,
                                     config=config, out=out, out_latent=out_latent)
    kpe_old, kpe_new = kpe[:, :o_len], kpe[:, o_len:]
    if not (expanded_programs in ("auto", None) or (isinstance(expanded_programs, int) and expanded_programs >= 0)):
        raise ValueError(f"expanded_programs must be 'auto', None or an int >= 0, got {expanded_programs!r}")
    # the window's ring shape, chosen once per call (the partition's test and the launch both need it)
    block = None
    if n_len > 0 and (expanded_programs == "auto" or expanded_programs):
        if window_block is None:                     # the first ring shape that applies, or None
            block = wg.choose_block(q, qpe, k_new, v_new, kpe_new, causal)
        elif wg.window_applies(q, qpe, k_new, v_new, kpe_new, causal, block_n=window_block[0],
                               stages=window_block[1]):
            block = window_block
    if expanded_programs == "auto":                  # a partition where the window kernel takes the call
        fits = s <= PARTITION_MAX_S and overlap and streams is None and block is not None
        expanded_programs = default_programs(s, o_len, n_len, num_sms(dev.index)) if fits else None
    latent_state = None if decode is None else decode.latent
    if n_len == 0:                                   # the absorbed design itself
        o_l, lse = flash_mla(qc, qpe, z_old, kpe_old, scale=scale, causal=causal, decode=latent_state)
        if out_latent is None:
            out_latent = o_l
        else:
            out_latent.copy_(o_l)
        out = torch.zeros((b, h, s, d), dtype=q.dtype, device=dev) if out is None else out.zero_()
        return out, out_latent, lse
    if out is None:
        out = torch.empty((b, h, s, d), dtype=q.dtype, device=dev)
    if out_latent is None:
        out_latent = torch.empty((b, h, s, k), dtype=q.dtype, device=dev)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=dev)

    def latent():     # the public entry's fast path: its checks once per call signature, its launches flat
        return flash_mla(qc, qpe, z_old, kpe_old, scale=scale, causal=False, decode=latent_state)

    def expanded():
        return _expanded_part(q, qpe, k_new, v_new, kpe_new, scale, causal, expanded_programs, block, window_kernel)

    (o_l, lse_l), (o_e, lse_e) = _run_parts(latent, expanded, dev, overlap, streams, bool(expanded_programs),
                                            decode)
    merge_parts(o_e, lse_e, o_l, lse_l, out, out_latent, lse)
    return out, out_latent, lse


def _expanded_part(q, qpe, k_new, v_new, kpe_new, scale: float, causal: bool, programs, block, window_kernel):
    """The hybrid's expanded part over the N newest keys: ``(o [B, H, S, D], lse)``. With
    ``programs``, a persistent kernel on that many SMs (the Gluon window kernel in ring shape
    ``block`` = (keys per block, ring depth), which :func:`~mla_var3.kernel.hopper.window_gluon.
    window_applies` accepted, where it is asked for; else, or with ``block`` None, the portable
    persistent one); without, the device's best expanded kernel."""
    b, h, s, d = q.shape
    n_len, dev = k_new.shape[1], q.device
    if programs:
        if window_kernel == "gluon" and block is not None:
            return wg.launch_window(q, qpe, k_new, v_new, kpe_new, scale=scale, causal=causal, programs=programs,
                                    block_n=block[0], stages=block[1])
        return expanded_persistent(q, qpe, k_new, v_new, kpe_new, scale=scale, causal=causal, programs=programs)
    if n_len >= s:          # the public launcher: whichever expanded backend is best on this device
        return _fa.flash_attention(q, qpe, k_new, v_new, kpe_new, scale=scale, causal=causal)
    # N < S (not causal): L = N < S, which the public launcher refuses; the portable kernel takes it
    o_e = torch.empty((b, h, s, d), dtype=torch.float32, device=dev)
    lse_e = torch.empty((b, h, s), dtype=torch.float32, device=dev)
    _fa._launch(q, qpe, k_new, v_new, kpe_new, o_e, lse_e, None, scale, causal,
                _fa._default_config(b, h, s, n_len, d, qpe.shape[-1], _fa._sms(dev)))
    return o_e, lse_e


def _run_parts(latent, expanded, dev, overlap: bool, streams, expanded_first: bool, decode=None):
    """``(latent(), expanded())``, the two parts issued one after the other, or with ``overlap``
    on two streams (the latent one on a side stream — ``decode``'s where the caller passes a
    :class:`~mla_var3.kernel.hybrid.HybridDecode` — or ``streams = (latent_stream,
    expanded_stream)``) forked from and joined to the current one; ``expanded_first``: a
    persistent expanded part holding an SM partition is issued first.

    The fork and the join are one event each way and the parts are issued with
    ``torch.cuda.set_stream`` (the current stream restored after them, also on an error): what
    ``Stream.wait_stream`` per stream and a ``torch.cuda.stream`` context per part do, with less
    host work on an eager call."""
    if not overlap:
        return latent(), expanded()
    if dev.index is not None and dev.index != torch.cuda.current_device():
        with torch.cuda.device(dev):                 # set_stream below also sets the current device
            return _run_parts(latent, expanded, dev, overlap, streams, expanded_first, decode)
    main = torch.cuda.current_stream(dev)
    if streams is None:
        streams = (_side_stream(dev) if decode is None else decode.side_stream(dev), main)
    lat_stream, exp_stream = streams
    forked = [st for st in (lat_stream, exp_stream) if st != main]
    if forked:                                       # inputs written on main are ready
        ready = main.record_event()
        for st in forked:
            st.wait_event(ready)
    order = ((exp_stream, expanded), (lat_stream, latent)) if expanded_first else ((lat_stream, latent),
                                                                                    (exp_stream, expanded))
    # expanded first: the persistent part holding an SM partition; else the compute-bound latent part
    # first, which fills the SMs, and the memory-bound expanded part takes SMs as they come free
    done = []
    try:
        for st, part in order:
            torch.cuda.set_stream(st)
            done.append(part())
    finally:
        torch.cuda.set_stream(main)
    exp, lat = done if expanded_first else done[::-1]
    for st in forked:                                # join before the merge
        main.wait_event(st.record_event())
    if not torch.cuda.is_current_stream_capturing():
        for st, outs in ((lat_stream, lat), (exp_stream, exp)):
            if st != main:                           # allocated on a forked stream, read on main
                for x in outs:
                    x.record_stream(main)
    return lat, exp


# The sm_90 default: at DeepSeek's widths (CHECKED_WIDTHS) it runs the seesaw latent kernel and
# the window kernel on an SM partition (or the expanded kernel alone at O = 0), 2-3x faster than
# the portable path it replaced as the default (measured on an H200: b = 32, t = 4,096, s = 32,
# N = 2,560: 2,155 us against the portable 4-7 ms; docs/kernels/mla-var6-plus/partition.md, "Outcome (a147d5b").
# Other widths run the portable path (at small widths the Gluon latent path failed 2 GPU tests
# when it was the default: a TMA stride assertion on NaN-padded views, an lse 2.1e-4 over 1e-4).
backends.register("mla_var6_plus", "gluon", mla_var6_plus_hopper, supports=backends.gluon_hopper, priority=10)
