"""The absorbed design's decode state, owned by the caller: plan once per decode step, run per layer.

A decode step attends every layer's queries to the same sequences, so what depends only on the
sequences' lengths — the split of their key blocks over the SMs (:class:`DecodePlan`) — is
built once and shared by the step's layers, as FlashMLA's ``tile_scheduler_metadata`` and
FlashInfer's ``BatchMLAPagedAttentionWrapper.plan()`` are. :class:`AbsorbedDecode` holds that
state for its owner:

* the plan, built on the GPU without a host synchronisation (:meth:`AbsorbedDecode.plan`, or by
  the first :meth:`~AbsorbedDecode.run` that needs one), with a stamp of the lengths it was
  built from: the lengths tensor's address and version counter (its values on the CPU). A run
  whose lengths differ from the stamp (another tensor, or the same one written in place since)
  builds a new plan instead of dropping keys; inside a CUDA-graph capture the new plan is
  built into the graph, so replays plan the lengths they find;
* the workspace of split items' fp32 partial outputs (one per stream, grown on demand; inside a
  capture a fresh one from the graph's pool, which the graph keeps);
* the TMA descriptor encodings of the addresses its runs have seen (bounded);
* the launches bound to those addresses (:meth:`AbsorbedDecode.bound`): everything an eager
  run's launches take but the fresh output's and LSE's addresses, kept per (call signature,
  inputs' addresses, scale, stream), used while their plan is this object's for the same lengths,
  and dropped with the plan or the workspace they point into, so a layer's next run builds no
  argument list (bounded).

Calls on one object are ordered on one stream at a time (the workspace is shared by its calls;
use one object per stream). Nothing here is kept in the module: two objects never share state,
and a call's behaviour depends on its arguments and the object alone. What *is* shared across
objects is compiled code — each kernel's compile cache and the seesaw kernel's per-signature
launch specs (:mod:`mla_var3.kernel.hopper.seesaw_host`), keyed by shapes, strides, dtypes and
flags, never by an address; a hit there does exactly what a miss does.

Every kernel variant a run may launch is compiled by the first run of its call signature,
before anything launches (a plan whose kind the GPU chooses may launch either of two kernels,
so both are compiled then), never by a later capture.

Lengths written in place are seen through the tensor's version counter. Tensors created under
``torch.inference_mode()`` have none: an in-place update of such a lengths tensor is not seen
(as with FlashMLA's metadata, plan again — :meth:`AbsorbedDecode.plan` — or pass a new tensor).

Example
-------
>>> dec = AbsorbedDecode(q.device)                                               # doctest: +SKIP
>>> dec.plan(seqlens, rows=h * s, capacity=table.shape[1] * 64)                  # once per step
>>> for layer in layers:                                                         # doctest: +SKIP
...     o, lse = dec.run_paged(qc[layer], qpe[layer], caches[layer], table, seqlens, scale=sm)
"""

from __future__ import annotations

import os
import sys
from types import MappingProxyType

import torch

from mla_var3.kernel import backends
from mla_var3.kernel._common import (
    CHECK_ENV, allowed_dtypes, bind_output, bind_shape, cdiv, check_device, check_inference, check_scale, cuda_index,
    check_seqlens, values_checked,
)
from mla_var3.kernel.decode_plan import (PLAN_BLOCK, DecodePlan, build_plan, device_sms, kept_uniform_plan,
                                         lengths_stamp, plan_decode, uniform_packed, uniform_plan)

__all__ = ["AbsorbedDecode", "entry_signature", "entry_spec", "fast_scale", "validate_dense", "validate_paged"]


class AbsorbedDecode:
    """Plan/run object of the absorbed design (see the module docstring).

    Parameters
    ----------
    device : torch device, optional   where its plans and workspaces live (default: the first
        run's inputs' device)
    backend : ``"auto"`` or a registered backend of ``flash_mla`` / ``flash_mla_paged``, chosen
        once here (:mod:`mla_var3.kernel.backends`)
    readback : copy a GPU-chosen plan kind to the host behind the planner
        (:class:`~mla_var3.kernel.decode_plan.KindReadback`), so that the step's later eager runs
        launch the chosen kernel alone; off for an object made for one call
    transient : an object made for one call (an entry point called without the caller's): it
        keeps no encodings and binds no launches, which no later call would use
    """

    #: TMA encodings kept per object (an eager step sees a few addresses per layer)
    MAX_ENCODINGS = 256
    #: bound launches kept per object (one per layer of a step, per stream)
    MAX_BOUND = 256

    def __init__(self, device: torch.device | str | None = None, *, backend: str = "auto",
                 readback: bool = True, transient: bool = False) -> None:
        if not isinstance(backend, str):
            raise ValueError(f"backend must be a string ('auto' or a registered name), got {backend!r}")
        self.device = None if device is None else torch.device(device)
        self.backend = backend
        self.readback = bool(readback)
        self.transient = bool(transient)
        self.decode_plan: DecodePlan | None = None
        self._given = False            # the plan came from the caller (use_plan): refuse other lengths
        self._workspaces: dict[int, torch.Tensor] = {}
        self._tma: dict = {}
        self._bound: dict = {}

    @classmethod
    def for_one_call(cls, device: torch.device | str | None = None, *, backend: str = "auto") -> "AbsorbedDecode":
        """The object an entry point makes when its caller passes none: transient, and without the
        kind readback (no later call would use either)."""
        return cls(device, backend=backend, readback=False, transient=True)

    def __repr__(self) -> str:
        p = self.decode_plan
        planned = "no plan" if p is None else f"plan for batch {p.batch}, rows {p.rows}, {p.max_blocks} blocks"
        return f"AbsorbedDecode(device={self.device}, backend={self.backend!r}, {planned})"

    # -- the plan -------------------------------------------------------------------------------
    def plan(self, seqlens: torch.Tensor | None = None, *, rows: int, capacity: int, batch: int | None = None,
             k: int = 512, sms: int | None = None, packed: bool | None = None) -> DecodePlan:
        """Build and keep the plan of one decode step (on the GPU, no host synchronisation;
        see :func:`~mla_var3.kernel.decode_plan.plan_decode` for the parameters). Later runs
        over the same lengths, unchanged, use it."""
        plan = plan_decode(seqlens, rows, capacity=capacity, k=k, batch=batch, sms=sms, packed=packed,
                           readback=self.readback)
        self._keep(plan, given=False)
        return plan

    @property
    def given(self) -> bool:
        """Whether the kept plan is the caller's (:meth:`use_plan`), not one this object built."""
        return self._given

    def use_plan(self, plan: DecodePlan) -> "AbsorbedDecode":
        """Run with ``plan`` (built by the caller with :func:`plan_decode`); a run over other
        lengths than it was built for then raises ValueError instead of planning anew."""
        if not isinstance(plan, DecodePlan):
            raise ValueError(f"plan must be a DecodePlan (mla_var3.kernel.decode_plan.plan_decode), got "
                             f"{type(plan).__name__}")
        self._keep(plan, given=True)
        return self

    def _keep(self, plan: DecodePlan, *, given: bool) -> None:
        if plan is not self.decode_plan:
            self._bound.clear()              # launches bound to the old plan's tensors
        self.decode_plan, self._given = plan, given
        if self.device is None:
            self.device = plan.items.device

    def plan_for(self, seqlens: torch.Tensor | None, source, batch: int, rows: int, capacity: int, *, k: int,
                 device: torch.device, packed: bool | None = None, num_splits: int | None = None) -> DecodePlan:
        """The plan a run uses: the kept one where it was built for these sequences (``source``:
        the caller's lengths tensor, or None for ``batch`` sequences of ``capacity`` keys), else
        a new one, kept (``packed`` as in :func:`plan_decode`; ``num_splits`` forces that many
        items per sequence of a uniform batch)."""
        kept = self.decode_plan
        max_blocks = cdiv(capacity, PLAN_BLOCK)
        if kept is not None:
            if self._given:
                kept.check_for(batch, rows, max_blocks, device)
                stamp = lengths_stamp(source)
                if kept.lengths is not None and stamp != kept.lengths:
                    raise ValueError("plan was built for other lengths than this call's (another lengths tensor, "
                                     "or the same one written since): build a plan per decode step")
                return kept
            if (kept.batch == batch and kept.rows == rows and kept.max_blocks >= max_blocks
                    and kept.items.device == device and kept.lengths == lengths_stamp(source)
                    and (source is not None or kept.max_blocks == max_blocks) and num_splits is None):
                return kept
        if seqlens is None:
            if num_splits is None and _capturing(device):
                # no host copy inside a capture: the host plan an eager call made for this shape (kept
                # for the process's life, so the graph may read it), else a plan of the same kind built on
                # the device (its kernels then run at every replay; the same items, so the same outputs
                # to the bit as an eager call's: an item plan where the host packs differed by 1.2e-4 at
                # b = 24, s = 4, t = 4,096 on an H200)
                plan = kept_uniform_plan(batch, rows, capacity, k=k, device=device)
                if plan is None:
                    plan = build_plan(None, batch, rows, max_blocks * PLAN_BLOCK, k=k, device=device,
                                      packed=uniform_packed(batch, rows, capacity, k=k, sms=device_sms(device)))
            else:
                plan = uniform_plan(batch, rows, capacity, k=k, device=device, num_splits=num_splits)
        else:
            plan = build_plan(seqlens, batch, rows, capacity, k=k, device=device, packed=packed,
                              readback=self.readback, source=source)
        if num_splits is None:
            self._keep(plan, given=False)
        return plan

    # -- what the kernels' launchers take from the owner -------------------------------------
    def workspace(self, slots: int, rows: int, k: int, device: torch.device, stream: int | None = None) -> torch.Tensor:
        """The split items' fp32 partial outputs ``[slots, rows, k]`` followed by their LSE
        ``[slots, rows]``, as one flat buffer: this object's on ``stream`` (grown on demand; calls
        on one stream run in order, so none overlaps the last one's combine), or a fresh
        allocation during a CUDA-graph capture (the graph keeps its memory) and off CUDA."""
        n = slots * rows * (k + 1)
        if device.type != "cuda" or stream is None or torch.cuda.is_current_stream_capturing():
            return torch.empty(n, dtype=torch.float32, device=device)
        buf = self._workspaces.get(stream)
        if buf is None or buf.numel() < n or buf.device.index != cuda_index(device):   # "cuda" names cuda:N too
            self._bound.clear()              # launches bound to the old buffer's addresses
            buf = self._workspaces[stream] = torch.empty(n, dtype=torch.float32, device=device)
        return buf

    def partials(self, slots: int, rows: int, k: int, device: torch.device,
                 stream: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`workspace` as ``(o_part [slots, rows, k], lse_part [slots, rows])`` views."""
        buf = self.workspace(slots, rows, k, device, stream)
        return buf[: slots * rows * k].view(slots, rows, k), buf[slots * rows * k: slots * rows * (k + 1)].view(
            slots, rows)

    def tma(self, spec, address: int, encode) -> tuple:
        """``encode(spec, address)`` (a TMA descriptor's launch arguments), kept per (spec,
        address) by this object: a step's layers come back to a few addresses."""
        if self.transient:
            return encode(spec, address)
        key = (spec, address)
        hit = self._tma.get(key)
        if hit is None:
            if len(self._tma) >= self.MAX_ENCODINGS:
                self._tma.clear()
            hit = self._tma[key] = encode(spec, address)
        return hit

    def bound(self, key: tuple):
        """The launches bound under ``key`` by :meth:`bind` (None: none, or dropped since)."""
        return self._bound.get(key)

    def bind(self, key: tuple, launches) -> None:
        """Keep ``launches`` (a launcher's arguments bound to this object's plan and workspace
        and to the addresses in ``key``) until the plan or a workspace changes; nothing in a
        transient object."""
        if self.transient:
            return
        if len(self._bound) >= self.MAX_BOUND:
            self._bound.clear()
        self._bound[key] = launches

    # -- runs -------------------------------------------------------------------------------
    def run(self, qc: torch.Tensor, qpe: torch.Tensor, z: torch.Tensor, kpe: torch.Tensor, *, scale: float,
            causal: bool = True, seqlens: torch.Tensor | None = None, out: torch.Tensor | None = None,
            config=None, num_splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Absorbed attention over a dense latent cache with this object's plan and workspace;
        arguments and returns as :func:`mla_var3.kernel.absorbed.flash_mla`. ``num_splits``:
        without ``seqlens``, force that many items per sequence (autotuning)."""
        entry = None
        if out is None and config is None and num_splits is None and fast_scale(scale):
            entry = entry_signature("dense", self.backend, causal, (qc, qpe, z, kpe), seqlens, None)
            spec = entry_spec(entry)
            if spec is not None:
                done = spec.launch(self, (qc.data_ptr(), qpe.data_ptr(), z.data_ptr(), kpe.data_ptr()), None, seqlens,
                                   seqlens, scale)
                if done is not None:
                    return _head_major(done, spec)
        check_inference(qc, qpe, z, kpe)
        sizes, lengths = validate_dense(qc, qpe, z, kpe, seqlens, out)
        scale = check_scale(scale)
        run = backends.select("flash_mla", qc.device, self.backend)
        return run(qc, qpe, z, kpe, scale=scale, causal=bool(causal), seqlens=lengths, config=config, out=out,
                   decode=self, source=seqlens, num_splits=num_splits, entry=entry)

    def run_paged(self, qc: torch.Tensor, qpe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                  seqlens: torch.Tensor, *, scale: float, causal: bool = True, out: torch.Tensor | None = None,
                  config=None, names: dict | None = None, entry: tuple | None = None) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
        """Absorbed attention over a paged latent cache with this object's plan and workspace;
        arguments and returns as :func:`mla_var3.kernel.absorbed.flash_mla_paged`. ``names``:
        the caller's names of the arguments, for error messages (e.g. FlashMLA's ``k_cache``);
        ``entry``: the caller's own call signature for its fast path (see
        :func:`mla_var3.kernel.hopper.seesaw_host.entry_spec`)."""
        if entry is None and out is None and config is None and fast_scale(scale):
            entry = entry_signature("paged", self.backend, causal, (qc, qpe, kv_cache, block_table), seqlens, None)
            spec = entry_spec(entry)
            if spec is not None:
                base = kv_cache.data_ptr()
                done = spec.launch(self, (qc.data_ptr(), qpe.data_ptr(), base, base + spec.kr_offset), block_table,
                                   seqlens, seqlens, scale)
                if done is not None:
                    return _head_major(done, spec)
        check_inference(qc, qpe, kv_cache)
        sizes, lengths = validate_paged(qc, qpe, kv_cache, block_table, seqlens, out, names=names)
        scale = check_scale(scale, name=(names or {}).get("scale", "scale"))
        run = backends.select("flash_mla_paged", qc.device, self.backend)
        return run(qc, qpe, kv_cache, block_table, lengths, scale=scale, causal=bool(causal), config=config,
                   out=out, decode=self, source=seqlens, entry=entry)


def entry_spec(entry: tuple | None):
    """The seesaw launch spec ``entry`` reached before, or None. Read from the seesaw host
    module where it is loaded (only it makes specs; it builds on this module, so it is not
    imported here: an import statement per call cost a decode call several microseconds)."""
    host = sys.modules.get(_SEESAW_HOST)
    if entry is None or host is None:
        return None
    return host.entry_spec(entry)


_SEESAW_HOST = "mla_var3.kernel.hopper.seesaw_host"


def fast_scale(scale) -> bool:
    """A scale the fast path takes as it is: a positive finite Python float (others go through
    :func:`check_scale`)."""
    return type(scale) is float and 0.0 < scale < float("inf")


def _capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def entry_signature(kind: str, backend: str, causal, tensors: tuple, seqlens, extra) -> tuple | None:
    """An entry point's call signature for the fast path (see
    :func:`mla_var3.kernel.hopper.seesaw_host.entry_spec`): every fact the entry's checks read —
    each tensor's shape, strides, dtype, device and 16-byte alignment, the lengths' (int32 and
    contiguous, or none), the flags — or None where the call cannot take the fast path: value
    checks on (``MLA_VAR3_CHECK``), an input needing a gradient, a non-tensor, other lengths."""
    if type(causal) is not bool or os.environ.get(CHECK_ENV, "0") not in ("", "0"):
        return None
    try:
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return None
        if seqlens is not None and not (seqlens.dtype == torch.int32 and seqlens.stride() == (1,)):
            return None
        key = [kind, backend, causal, extra]
        for t in tensors:
            key += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)
        if seqlens is not None:
            key += (seqlens.shape, seqlens.device, seqlens.data_ptr() % 16)
        return tuple(key)
    except AttributeError:
        return None


def _head_major(done: tuple, spec) -> tuple[torch.Tensor, torch.Tensor]:
    """A fast launch's ``(output in the kernel's row order, lse)`` as ``([B, H, S, K], lse)``."""
    o, lse = done
    return (o if spec.geometry[7] else o.transpose(1, 2)), lse


# ---------------------------------------------------------------------------------------------
# validation (every entry point of the absorbed design)


def _check_pow2(name: str, value: int, what: str) -> None:
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name}: {what} must be a power of two >= 16 for the Triton kernel, got {value}")


def _check_queries(qc, qpe, out, names: dict):
    """Validate qc/qpe (and out) and return (sizes, device)."""
    sizes: dict[str, int] = {}
    if not isinstance(qc, torch.Tensor):
        raise ValueError(f"{names['qc']} must be a torch.Tensor [B, H, S, K], got {type(qc).__name__}")
    device = qc.device
    check_device(names["qc"], qc)
    dtypes = allowed_dtypes(device)
    bind_shape(names["qc"], qc, "B H S K", sizes, dtypes=dtypes, device=device)
    bind_shape(names["qpe"], qpe, "B H S P", sizes, dtypes=(qc.dtype,), device=device)
    _check_pow2(names["qc"], sizes["K"], "the latent width K (last dim)")
    _check_pow2(names["qpe"], sizes["P"], "the RoPE width P (last dim)")
    if out is not None:
        bind_output(names["out"], out, "B H S K", sizes, dtypes=(qc.dtype,), device=device)
    return sizes, device


_DENSE_NAMES = MappingProxyType({"qc": "qc", "qpe": "qpe", "out": "out", "seqlens": "seqlens"})
_PAGED_NAMES = MappingProxyType({**_DENSE_NAMES, "kv_cache": "kv_cache", "block_table": "block_table"})


def validate_dense(qc, qpe, z, kpe, seqlens, out) -> tuple[dict, torch.Tensor | None]:
    """Check a dense call's inputs: ``(sizes, seqlens as int32 or None)``; ValueError naming the
    argument otherwise (lengths' values on the CPU, and on CUDA with ``MLA_VAR3_CHECK=1``)."""
    sizes, device = _check_queries(qc, qpe, out, _DENSE_NAMES)
    bind_shape("z", z, "B T K", sizes, dtypes=(qc.dtype,), device=device)
    bind_shape("kpe", kpe, "B T P", sizes, dtypes=(qc.dtype,), device=device)
    if sizes["S"] > sizes["T"]:
        raise ValueError(f"qc has S={sizes['S']} query tokens but z holds only T={sizes['T']} keys; "
                         f"the cache must include the new tokens (S <= T)")
    seqlens = check_seqlens(seqlens, sizes["B"], sizes["T"], sizes["S"], device)
    return sizes, seqlens


def validate_paged(qc, qpe, kv_cache, block_table, seqlens, out,
                   names: dict | None = None) -> tuple[dict, torch.Tensor]:
    """Check a paged call's inputs: ``(sizes with T = max_blocks * page, seqlens as int32)``.
    ``names`` renames the arguments in messages (``{"kv_cache": "k_cache", ...}``)."""
    nm = _PAGED_NAMES if names is None else {**_PAGED_NAMES, **names}
    sizes, device = _check_queries(qc, qpe, out, nm)
    width = sizes["K"] + sizes["P"]
    bind_shape(nm["kv_cache"], kv_cache, f"NB PAGE 1 {width}", sizes, dtypes=(qc.dtype,), device=device)
    if kv_cache.stride(3) != 1:
        raise ValueError(f"{nm['kv_cache']} must have a unit stride in its last dim, got strides "
                         f"{list(kv_cache.stride())}")
    bind_shape(nm["block_table"], block_table, "B MAXB", sizes, dtypes=(torch.int32,), device=device)
    if seqlens is None:
        raise ValueError(f"{nm['seqlens']} [B] int32 is required with a paged cache")
    t = sizes["MAXB"] * sizes["PAGE"]
    if sizes["S"] > t:
        raise ValueError(f"{nm['qc']} has S={sizes['S']} query tokens but {nm['block_table']} covers only "
                         f"T={t} keys (max_blocks {sizes['MAXB']} x page_block_size {sizes['PAGE']})")
    seqlens = check_seqlens(seqlens, sizes["B"], t, sizes["S"], device, name=nm["seqlens"])
    if sizes["B"] and values_checked(device):
        # every block a sequence uses must be a valid page
        page = sizes["PAGE"]
        used = torch.arange(sizes["MAXB"], device=device)[None, :] < (seqlens.long()[:, None] + page - 1) // page
        pages = block_table[used]
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= sizes["NB"]):
            raise ValueError(f"{nm['block_table']} entries for the blocks within {nm['seqlens']} must lie in "
                             f"[0, num_blocks={sizes['NB']}), got min {int(pages.min())}, max {int(pages.max())}")
    sizes["T"] = t
    return sizes, seqlens
