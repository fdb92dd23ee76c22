"""Host side of the seesaw kernel (:mod:`mla_var3.kernel.hopper.absorbed_seesaw`): which calls it
takes (:func:`seesaw_applies`) and how a call launches it (:func:`seesaw_attention`).

A call's launches are fixed by its **signature** — the shapes, strides and dtypes of its
tensors, the flags (causal, paged, lengths, row order), the pointers' 16-byte alignment and the
device — up to the addresses, the plan's tensors and the scale. A :class:`SeesawSpec` holds
what a signature fixes: the kernel of every kind a plan may launch, compiled on the first call's
own tensors before anything launches (so that no later call, captured or not, compiles), the
integer arguments, and the TMA layout of the queries, keys and output. Specs are compiled code:
kept per signature (bounded), never per address, and a hit does exactly what a miss does.

What depends on the data — the plan, the workspace of partial outputs and the TMA encodings of
the addresses seen — belongs to the caller's :class:`mla_var3.kernel.decode.AbsorbedDecode`.

A launch then costs: the signature (a tuple of sizes), the plan's check, two output
allocations, six descriptor encodings (kept by the owner per address, and shared by the two
launches of a gated plan) and one or two C launcher calls with the arguments flattened, plus the
combine's launch when the plan splits.

Plan kinds (:class:`~mla_var3.kernel.decode_plan.DecodePlan`): a plan whose kind the host
fixed runs one kernel (one item per program, or ``PERSISTENT`` for a packed plan); a plan whose
kind the GPU chose runs both ``GATED`` kernels, the item kernel first and the packed one as its
programmatic dependent, each exiting unless the plan is its kind, or — in an eager call once
the choice has reached the host (:meth:`DecodePlan.known_kind`) — the chosen one alone,
launched plainly. All three are compiled by the plan's first call.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from mla_var3.kernel._common import cdiv
from mla_var3.kernel._launch import TmaSpec, current_stream, tma_arg
from mla_var3.kernel.combine import combine_flat, combine_planned
from mla_var3.kernel.decode_plan import DecodePlan, lengths_stamp
from mla_var3.kernel.hopper import _gluon
from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE

if GLUON_AVAILABLE:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mla_var3.kernel.hopper.absorbed_seesaw import BLOCK_M, BLOCK_N, LAUNCH, LAUNCH_AFTER
else:  # pragma: no cover - depends on the installed triton
    BLOCK_M = BLOCK_N = 64

__all__ = ["SeesawSpec", "seesaw_applies", "seesaw_attention"]

#: a launch: (PERSISTENT, GATED, programmatic dependent launch)
_ITEM, _PACKED = (False, False, False), (True, False, False)
_GATED_ITEM, _GATED_PACKED, _GATED_PACKED_AFTER = (False, True, False), (True, True, False), (True, True, True)
#: the launches of a plan whose kind the GPU chose, before its choice is known on the host
_GATED_PAIR = (_GATED_ITEM, _GATED_PACKED_AFTER)


def seesaw_applies(qc: torch.Tensor, qpe: torch.Tensor, keys: tuple, *, paged: bool = False) -> bool:
    """Whether the default path runs the seesaw kernel: DeepSeek's widths ``K == 512, P == 64``
    (the only ones checked on a GPU; the kernel compiles for any ``K`` a multiple of 128 up to
    512 with ``P == 64``), bf16/fp16 queries whose rows (``head * S + token`` or ``token * H +
    head``) are evenly strided alike in ``qc`` and ``qpe``, keys that TMA can address (unit last
    stride, 16-byte aligned base and strides), and 64-token pages for a paged cache."""
    k, p = qc.shape[-1], qpe.shape[-1]
    if not (GLUON_AVAILABLE and p == 64 and k == 512 and qc.dtype in (torch.bfloat16, torch.float16)):
        return False
    order, order_pe = row_order(qc), row_order(qpe)
    if order is None or order_pe is None or order_pe[0] != order[0]:
        return False
    if paged:
        cache = keys[0]
        return cache.shape[1] == BLOCK_N and _tma_ok(cache) and _tma_ok(cache[..., k:])
    return _tma_ok(keys[0]) and _tma_ok(keys[1])


def _tma_ok(x: torch.Tensor) -> bool:
    """A unit last stride, a 16-byte aligned base and 16-byte multiples for the other strides."""
    e = x.element_size()
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all((st * e) % 16 == 0 for st in x.stride()[:-1])


def row_order(x: torch.Tensor) -> tuple[bool, int] | None:
    """How ``x [B, H, S, W]`` lays out its rows: ``(head_major, row_stride)`` when row
    ``head * S + token`` (head-major) or ``token * H + head`` sits at ``row * row_stride`` with a
    unit last stride and 16-byte aligned strides (TMA); None otherwise."""
    _, h, s, _ = x.shape
    sb, sh, ss, sw = x.stride()
    if sw != 1 or (x.data_ptr() % 16) or (sb * x.element_size()) % 16:
        return None
    if s == 1 or h == 1 or sh == s * ss:
        order = (True, sh if s == 1 else ss)
    elif ss == h * sh:
        order = (False, sh)
    else:
        return None
    return order if (order[1] * x.element_size()) % 16 == 0 else None


class SeesawSpec:
    """What one call signature of the seesaw kernel fixes (see the module docstring), and the
    launch of a call with that signature.

    ``geometry``: ``(b, h, s, k, p, t, max_blocks, head_major, paged)``; ``in_tma``: the (shape,
    strides) of the queries', RoPE queries', keys' and RoPE keys' TMA views; ``tail``: the
    integer arguments after the pointers (the scale's place is filled per call)."""

    def __init__(self, geometry: tuple, in_tma: tuple, tail: tuple, consts: dict, key: tuple, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.geometry, self.in_tma, self.tail, self.consts, self.key = geometry, in_tma, tail, consts, key
        self.dtype, self.device, self.index = dtype, device, device.index
        b, h, s, k = geometry[:4]
        self.rows, self.t = h * s, geometry[5]
        self.lse_shape = (b, h, s)
        #: a fresh output's shapes: the row order the kernel writes ([B, H, S, K] head-major, else
        #: [B, S, H, K]); ``token_major`` is [B, S, H, K], the same memory where the kernel's rows are
        #: head-major only because S = 1 or H = 1
        self.alloc = (b, h, s, k) if geometry[7] else (b, s, h, k)
        self.o_view = ((b, h * s, k), (h * s * k, k, 1))
        #: where a paged cache row's RoPE piece starts, in bytes past its latent
        self.kr_offset = k * dtype.itemsize
        self.op_tmas: dict = {}      # partial slots -> the partials' TMA spec (shape-determined)
        self.flats: dict = {}        # launch -> (FlatLaunch, input TMA specs, output and partial metadata)
        self._tma_specs: dict = {}   # a TMA spec's fields -> the one spec object the launches share
        self.combine = None          # (FlatLaunch, grid, integer arguments) of the split-KV combine
        self.o_tma = self.op_tma = None

    def kinds_of(self, plan: DecodePlan) -> tuple:
        """Every launch ``plan`` may take (compiled together)."""
        if plan.starts is None or plan.packed is None:
            return (_PACKED if plan.starts is not None else _ITEM,)
        return (_GATED_ITEM, _GATED_PACKED_AFTER, _GATED_PACKED)

    @staticmethod
    def launches_for(plan: DecodePlan) -> tuple:
        """The launches ``plan`` takes now (see the module docstring)."""
        if plan.starts is None or plan.packed is None:
            return (_PACKED if plan.starts is not None else _ITEM,)
        known = plan.known_kind()
        if known is None:
            return _GATED_PAIR
        return (_GATED_PACKED,) if known else (_GATED_ITEM,)

    def grid(self, plan: DecodePlan, kind: tuple) -> tuple[int, int, int]:
        persistent, gated, _ = kind
        programs = (plan.packed_programs if gated else plan.programs) if persistent else plan.max_items
        return cdiv(self.rows, BLOCK_M), programs, 1

    def consts_for(self, kind: tuple) -> dict:
        """The kernel's constexprs for launch ``kind``."""
        return dict(self.consts, PERSISTENT=kind[0], GATED=kind[1])

    def compile(self, kinds: tuple, real_args) -> None:
        """Compile the launches ``kinds`` not compiled yet (``real_args(kind)``: the kernel's
        arguments on real tensors), before any of them launches, and keep each as a
        :class:`~mla_var3.kernel._launch.FlatLaunch` with the TMA specs of its inputs. Under a
        launch hook (a profiler) nothing is kept and launches take Triton's own path."""
        for kind in kinds:
            if kind in self.flats:
                continue
            launcher = LAUNCH_AFTER if kind[2] else LAUNCH
            key = (self.key, kind)
            launcher.prepare(key, (1, 1, 1), real_args(kind), self.consts_for(kind), num_warps=4)
            flat = launcher.flat(key)
            if flat is not None:
                meta = [flat.desc_meta[i] for i in range(6)]
                ins = tuple(self._one_spec(TmaSpec.of(m, shape, strides))
                            for m, (shape, strides) in zip(meta[:4], self.in_tma))
                self.o_tma = self._one_spec(TmaSpec.of(meta[4], *self.o_view))
                self.op_tma = meta[5]
                self.flats[kind] = (flat, ins)

    def _one_spec(self, spec: TmaSpec) -> TmaSpec:
        """The spec object already held with ``spec``'s fields, else ``spec``: the kinds of a
        gated plan read their inputs through equal descriptors, so an owner keeping encodings
        per (spec, address) encodes each address once for both launches."""
        return self._tma_specs.setdefault((spec.swizzle, spec.elem_size, spec.elem_type, spec.block, spec.shape,
                                           spec.strides), spec)

    def launch(self, decode, addresses: tuple, table, seqlens, source, scale: float, *, token_major: bool = False,
               num_splits: int | None = None):
        """Launch a call of this signature on the addresses of its queries, RoPE queries, keys
        and RoPE keys: ``(output, lse)``, the output fresh in the kernel's row order (``alloc``;
        ``token_major``: as [B, S, H, K]), or None where a launch the plan takes is not compiled
        yet or no combine is ready (then the caller takes the path that compiles, with its
        tensors). ``table``, ``seqlens``: tensors or None; ``source``: the caller's lengths
        tensor (the plan's stamp).

        An eager call binds its launches in ``decode`` (:meth:`bind`), and a later call on the same
        addresses, scale and stream whose plan is still the owner's, for the same lengths, reuses
        them; a capture binds nothing (its workspace is the graph's own), nor does a transient
        ``decode`` (made for this call)."""
        stream = current_stream(self.index)
        key = None
        if not (decode.transient or torch.cuda.is_current_stream_capturing()):
            key = (self, addresses, None if table is None else table.data_ptr(),
                   None if seqlens is None else seqlens.data_ptr(), scale, stream, num_splits)
            bound = decode.bound(key)
            if bound is not None and bound.current(decode, source):
                o, lse = self._outputs(token_major)
                bound.fire(decode, stream, o.data_ptr(), lse.data_ptr())
                return o, lse
        plan = decode.plan_for(seqlens, source, self.geometry[0], self.rows, self.t, k=self.geometry[3],
                               device=self.device, num_splits=num_splits)
        kinds = self.launches_for(plan)
        flats = self.flats
        for kind in kinds:
            if kind not in flats:
                return None
        if plan.may_split and self.combine is None:
            return None
        o, lse = self._outputs(token_major)
        bound = self.bound_launches(decode, plan, kinds, addresses, table, seqlens, scale, stream)
        bound.fire(decode, stream, o.data_ptr(), lse.data_ptr())
        if key is not None:
            decode.bind(key, bound)
        return o, lse

    def _outputs(self, token_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A call's fresh output (in the kernel's row order, or [B, S, H, K]) and LSE [B, H, S]."""
        o = torch.empty(self.alloc if not token_major else self.alloc_token_major, dtype=self.dtype, device=self.device)
        return o, torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)

    @property
    def alloc_token_major(self) -> tuple:
        b, h, s, k = self.geometry[:4]
        return (b, s, h, k)

    def issue(self, decode, plan: DecodePlan, kinds: tuple, addresses: tuple, o_addr: int, lse_addr: int, table,
              seqlens, scale: float, partials: torch.Tensor | None = None) -> None:
        """The launches ``kinds`` of ``plan`` (compiled: :meth:`compile`) and the combine, writing
        the output at ``o_addr`` (laid out as :attr:`o_view`) and the LSE at ``lse_addr``;
        ``partials``: the caller's view of the owner's workspace (default: the owner's)."""
        stream = current_stream(self.index)
        self.bound_launches(decode, plan, kinds, addresses, table, seqlens, scale, stream,
                            partials).fire(decode, stream, o_addr, lse_addr)

    def bound_launches(self, decode, plan: DecodePlan, kinds: tuple, addresses: tuple, table, seqlens, scale: float,
                       stream: int, partials: torch.Tensor | None = None) -> "BoundLaunches":
        """The launches ``kinds`` of ``plan`` and the combine with every argument bound but the
        output's and the LSE's addresses (see :meth:`issue`)."""
        rows, k = self.rows, self.geometry[3]
        ws = partials if partials is not None else decode.workspace(plan.max_slots, rows, k, self.device, stream)
        op_addr, lp_addr = ws.data_ptr(), ws.data_ptr() + plan.max_slots * rows * k * 4   # partials, then their LSE
        items = plan.items.data_ptr()
        post = (lp_addr, op_addr, seqlens.data_ptr() if seqlens is not None else items,
                table.data_ptr() if table is not None else items, items,
                plan.starts.data_ptr() if plan.starts is not None else items,
                plan.packed.data_ptr() if plan.packed is not None else items,
                *self.tail[:5], scale * _gluon.LOG2E, *self.tail[6:])
        op_spec = self.op_tmas.get(plan.max_slots)
        if op_spec is None:
            op_spec = self.op_tmas[plan.max_slots] = TmaSpec.of(self.op_tma, (plan.max_slots, rows, k), (rows * k, k, 1))
        enc = decode.tma
        q_a, qr_a, z_a, kr_a = addresses
        launches = []
        for kind in kinds:
            flat, ins = self.flats[kind]
            pre = (*enc(ins[0], q_a, tma_arg), *enc(ins[1], qr_a, tma_arg), *enc(ins[2], z_a, tma_arg),
                   *enc(ins[3], kr_a, tma_arg))
            launches.append((flat, self.grid(plan, kind), pre, enc(op_spec, op_addr, tma_arg), post))
        combine = None
        if plan.may_split:
            flat, grid, ints = self.combine
            combine = (flat, grid, (op_addr, lp_addr, plan.seqs.data_ptr()), ints)
        return BoundLaunches(plan, kinds, self.o_tma, tuple(launches), combine, ws)


class BoundLaunches:
    """A call's launches with every argument bound but the output's and the LSE's addresses
    (:meth:`SeesawSpec.bound_launches`); ``plan`` and ``workspace`` are held so that the
    addresses bound stay theirs while it lives, and ``kinds`` are the launches ``plan`` took."""

    __slots__ = ("plan", "kinds", "o_tma", "launches", "combine", "workspace")

    def __init__(self, plan: DecodePlan, kinds: tuple, o_tma, launches: tuple, combine, workspace) -> None:
        self.plan, self.kinds, self.o_tma, self.launches = plan, kinds, o_tma, launches
        self.combine, self.workspace = combine, workspace

    def current(self, decode, source) -> bool:
        """Whether a call with lengths ``source`` would take these launches: the plan is still
        ``decode``'s and was built for these lengths (its stamp), and its launches are still
        ``kinds`` (a gated pair until the GPU's choice of kind reaches the host)."""
        plan = self.plan
        return (decode.decode_plan is plan and plan.lengths == lengths_stamp(source)
                and (self.kinds is not _GATED_PAIR or plan.known_kind() is None))

    def fire(self, decode, stream: int, o_addr: int, lse_addr: int) -> None:
        """Issue the launches on ``stream``, writing the output at ``o_addr`` (its TMA encoding
        kept by ``decode``) and the LSE at ``lse_addr``."""
        o_desc = decode.tma(self.o_tma, o_addr, tma_arg)
        for flat, grid, pre, op_desc, post in self.launches:
            flat.launch(grid, stream, (*pre, *o_desc, *op_desc, lse_addr, *post))
        if self.combine is not None:
            flat, grid, head, ints = self.combine
            flat.launch(grid, stream, (*head, o_addr, lse_addr, *ints))


#: per-signature launch specs, under the kernel's signature and under each entry point's
#: signature that has reached them (compiled code; see the module docstring)
_SPECS: "OrderedDict[tuple, SeesawSpec]" = OrderedDict()
_MAX_SPECS = 256


def _keep_spec(key: tuple, spec: SeesawSpec) -> None:
    if len(_SPECS) >= _MAX_SPECS:
        _SPECS.popitem(last=False)
    _SPECS[key] = spec


def entry_spec(entry: tuple) -> SeesawSpec | None:
    """The launch spec an entry point's call signature reached before (None: never, or
    forgotten), for the entry's fast path: ``entry`` holds every fact the entry's checks and
    :func:`seesaw_applies` read (shapes, strides, dtypes, device, alignments, flags), so a call
    whose signature is found passes them exactly as that earlier call did."""
    return _SPECS.get(entry)


def _signature(qc, qpe, keys, block_table, seqlens, causal: bool, head_major: bool) -> tuple:
    """Everything a call's launches are specialised on but addresses, plan and scale (the
    inputs' alignment included: TMA needs 16 bytes, :func:`seesaw_applies` checked it)."""
    z, kpe = keys
    tab = None if block_table is None else (block_table.shape, block_table.stride(), block_table.data_ptr() % 16)
    seq = None if seqlens is None else seqlens.data_ptr() % 16
    return ("kernel", qc.device.index, qc.dtype, qc.shape, qc.stride(), qpe.shape, qpe.stride(), z.shape, z.stride(),
            None if kpe is None else (kpe.shape, kpe.stride()), tab, seq, bool(causal), head_major)


def _build_spec(qc, qpe, keys, block_table, seqlens, causal: bool, head_major: bool, signature: tuple) -> SeesawSpec:
    b, h, s, k = qc.shape
    p = qpe.shape[-1]
    rows = h * s
    paged = block_table is not None
    if paged:
        cache = keys[0]
        nb, page, _, _ = cache.shape
        t, max_blocks, tstrides = block_table.shape[1] * page, block_table.shape[1], block_table.stride()
        cs = cache.stride()
        z_view = ((nb, page, k), (cs[0], cs[1], 1))
        kr_view = ((nb, page, p), (cs[0], cs[1], 1))
    else:
        z, kpe = keys
        t, max_blocks, tstrides = z.shape[1], cdiv(z.shape[1], BLOCK_N), (0, 0)
        z_view, kr_view = (tuple(z.shape), tuple(z.stride())), (tuple(kpe.shape), tuple(kpe.stride()))
    q_view = ((b, rows, k), (qc.stride(0), row_order(qc)[1], 1))
    qr_view = ((b, rows, p), (qpe.stride(0), row_order(qpe)[1], 1))
    tail = (rows, s, h, t, max_blocks, None, rows, s, 1, *tstrides)     # lse [B, H, S] is contiguous
    consts = dict(K=k, P=p, CAUSAL=bool(causal), PAGED=paged, HAS_SEQLENS=seqlens is not None, HEAD_MAJOR=head_major)
    geometry = (b, h, s, k, p, t, max_blocks, head_major, paged)
    return SeesawSpec(geometry, (q_view, qr_view, z_view, kr_view), tail, consts, signature, qc.dtype, qc.device)


def seesaw_attention(qc: torch.Tensor, qpe: torch.Tensor, keys: tuple, *, scale: float, causal: bool,
                     seqlens: torch.Tensor | None, decode, source=None, block_table: torch.Tensor | None = None,
                     out: torch.Tensor | None = None, num_splits: int | None = None, checked: bool = False,
                     entry: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the seesaw kernel on validated inputs (the backend behind ``flash_mla`` and
    ``flash_mla_paged`` on sm_90; see :func:`seesaw_applies`).

    qc [B, H, S, K], qpe [B, H, S, P]: bf16/fp16 with the same row order.
    keys: dense ``(z [B, T, K], kpe [B, T, P])``; paged ``(cache [pages, 64, 1, K + P], None)``
        with ``block_table [B, max_blocks]`` (any strides).
    seqlens [B] int32 or None (every sequence T keys); decode: the caller's
        :class:`~mla_var3.kernel.decode.AbsorbedDecode` (plan, workspace, encodings); source: the
        caller's lengths tensor ``seqlens`` came from (the plan's stamp; default ``seqlens``).
    out [B, H, S, K] optional, written in place (any strides; through a temporary when its rows
        are not laid out as a fresh output's). num_splits: without seqlens, force that many items
        per sequence. checked: the caller has already asked :func:`seesaw_applies`. entry: the
        caller's call signature (see :func:`entry_spec`), kept for its next calls once this one
        has compiled everything.

    Returns ``(o_latent [B, H, S, K], lse [B, H, S] float32)``; no host synchronisation.
    """
    b, h, s, k = qc.shape
    p = qpe.shape[-1]
    rows = h * s
    dev = qc.device
    order = row_order(qc)
    paged = block_table is not None
    if not (checked or seesaw_applies(qc, qpe, keys, paged=paged)):
        raise ValueError("the seesaw kernel needs K = 512, P = 64, bf16/fp16, qc and qpe with rows laid out alike "
                         "(head * S + token or token * H + head) and TMA-addressable keys (see seesaw_applies)")
    head_major = order[0]
    o_run = torch.empty((b, h, s, k) if head_major else (b, s, h, k), dtype=qc.dtype, device=dev)
    if not head_major:
        o_run = o_run.transpose(1, 2)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=dev)
    if b == 0 or rows == 0:
        if out is not None:
            return out, lse
        return o_run, lse
    cache = keys[0]
    if paged:
        t = block_table.shape[1] * cache.shape[1]
        kr_addr = cache.data_ptr() + k * cache.element_size()
    else:
        t = cache.shape[1]
        kr_addr = keys[1].data_ptr()
    source = source if source is not None else seqlens
    plan = decode.plan_for(seqlens, source, b, rows, t, k=k, device=dev, num_splits=num_splits)
    signature = _signature(qc, qpe, keys, block_table, seqlens, causal, head_major)
    spec = _SPECS.get(signature)
    if spec is None:
        spec = _build_spec(qc, qpe, keys, block_table, seqlens, causal, head_major, signature)
        _keep_spec(signature, spec)
    stream = current_stream(dev.index)
    op, lp = decode.partials(plan.max_slots, rows, k, dev, stream)     # views of one workspace: issue() needs op
    seq = seqlens if seqlens is not None else plan.items
    table = block_table if paged else plan.items
    starts = plan.starts if plan.starts is not None else plan.items
    packed = plan.packed if plan.packed is not None else plan.items
    tail = (*spec.tail[:5], scale * _gluon.LOG2E, *spec.tail[6:])

    def real_args(kind: tuple) -> tuple:
        """The kernel's arguments on this call's tensors (to compile it, or under a launch hook)."""
        def desc(x, view, rows_per_box, w):
            box = (1, rows_per_box, w)
            return TensorDescriptor(x, list(view[0]), list(view[1]), list(box), _gluon.layout(box, x.dtype))
        q_v, qr_v, z_v, kr_v = spec.in_tma
        kr = cache[..., k:] if paged else keys[1]
        return (desc(qc, q_v, BLOCK_M, k // 2), desc(qpe, qr_v, BLOCK_M, p), desc(cache, z_v, BLOCK_N, k // 2),
                desc(kr, kr_v, BLOCK_N, p), desc(o_run, spec.o_view, BLOCK_M, k // 2),
                desc(op, ((plan.max_slots, rows, k), (rows * k, k, 1)), BLOCK_M, k // 2),
                lse, lp, op, seq, table, plan.items, starts, packed, *tail)

    spec.compile(spec.kinds_of(plan), real_args)
    kinds = spec.launches_for(plan)
    if all(kind in spec.flats for kind in kinds) and (spec.combine is not None or not plan.may_split):
        spec.issue(decode, plan, kinds, (qc.data_ptr(), qpe.data_ptr(), cache.data_ptr(), kr_addr), o_run.data_ptr(),
                   lse.data_ptr(), block_table, seqlens, scale, op)
    else:   # the first split call (the combine compiles), or a launch hook: Triton's own launch path
        for kind in kinds:
            (LAUNCH_AFTER if kind[2] else LAUNCH)((spec.key, kind), spec.grid(plan, kind), real_args(kind),
                                                  spec.consts_for(kind), num_warps=4)
        if plan.may_split:
            combine_planned(op, lp, plan.seqs, o_run, lse, head_major=head_major)
            spec.combine = combine_flat(op, lp, plan.seqs, o_run, lse, head_major=head_major)
    if entry is not None and spec.flats:
        _keep_spec(entry, spec)
    if out is not None:
        out.copy_(o_run)
        return out, lse
    return o_run, lse
