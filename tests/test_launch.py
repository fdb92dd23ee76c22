"""The direct launch path (:mod:`mla_var3.kernel._launch`) and what the seesaw kernel's host side
(:mod:`mla_var3.kernel.hopper.seesaw_host`) decides per plan, checked without a GPU: the
compiled kernel's C launcher is replaced by a recorder, so what a launch passes can be compared
with what it should pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from mla_var3.kernel import _launch
from mla_var3.kernel._launch import CachedLaunch, FlatLaunch, TmaSpec
from mla_var3.kernel.decode import AbsorbedDecode


@triton.jit
def _toy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


class _Ptr:
    """Stands for a tensor argument: only its address is read."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


@pytest.fixture()
def direct(monkeypatch):
    """A CachedLaunch of ``_toy`` on a faked direct path: ``(launch, calls)``, where ``calls``
    collects each C-launcher call's flat arguments."""
    calls: list[tuple] = []
    monkeypatch.setattr(_launch, "interpreting", lambda: False)
    monkeypatch.setattr(_launch, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda index: 0xABC)))
    launch = CachedLaunch(_toy)
    compiled = SimpleNamespace(function="cufunction")
    raw = lambda *args: calls.append(args)  # noqa: E731
    launch._compiled[(0, "key")] = (compiled, (64,), (raw, ("coop", "pdl"), {}, {}), dict(BLOCK=64))
    return launch, calls


def test_a_compiled_key_launches_through_the_c_launcher(direct):
    launch, calls = direct
    x, y = _Ptr(0x3000), _Ptr(0x4000)
    launch("key", (2, 3, 1), (x, y, 17), dict(BLOCK=64), num_warps=4)
    assert calls == [(2, 3, 1, 0xABC, "cufunction", "coop", "pdl", x, y, 17, 64)]


def test_a_key_called_with_other_constexprs_than_it_was_compiled_with_raises(direct):
    """A launcher whose key misses a constexpr (the window kernel's missed ``CAUSAL`` until
    measured on an H200: a non-causal call ran the causal kernel compiled before it) is refused
    instead of running the kernel compiled for the other value."""
    launch, calls = direct
    with pytest.raises(RuntimeError, match="must include every constexpr"):
        launch("key", (1, 1, 1), (_Ptr(1), _Ptr(2), 3), dict(BLOCK=128), num_warps=4)
    assert calls == []


def test_flat_launch_passes_the_fixed_parts_then_the_flat_arguments(direct):
    launch, calls = direct
    flat = launch.flat("key")
    assert isinstance(flat, FlatLaunch) and flat.desc_meta == {}
    flat.launch((4, 5, 1), 0xDEF, (0x3000, 0x4000, 9))
    assert calls == [(4, 5, 1, 0xDEF, "cufunction", "coop", "pdl", 0x3000, 0x4000, 9, 64)]
    assert launch.flat("never compiled") is None


def test_prepare_compiles_without_launching_then_the_key_is_ready(direct, monkeypatch):
    """``prepare`` compiles through the kernel's warm-up (no launch), once per key; the key is
    then ready and flat; under the interpreter it does nothing."""
    launch, calls = direct
    warmed: list = []
    compiled = SimpleNamespace(function="cufunction-2")
    monkeypatch.setattr(_launch, "_direct_launcher", lambda c: (lambda *a: calls.append(a), ("coop", "pdl"), {}, {}))
    monkeypatch.setattr(launch, "fn", SimpleNamespace(warmup=lambda *args, grid, **kw: warmed.append((grid, kw))
                                                      or compiled))
    launch._const_names = ["BLOCK"]
    assert not launch.ready("new key")
    for _ in range(2):
        launch.prepare("new key", (2, 3, 1), (_Ptr(1), _Ptr(2), 3), dict(BLOCK=64), num_warps=4)
    assert warmed == [((2, 3, 1), dict(BLOCK=64, num_warps=4))] and calls == []
    assert launch.ready("new key")
    launch.flat("new key").launch((1, 1, 1), 7, (1, 2, 3))
    assert calls[0][4] == "cufunction-2" and calls[0][-1] == 64
    monkeypatch.setattr(_launch, "interpreting", lambda: True)
    launch.prepare("third key", (1, 1, 1), (_Ptr(1), _Ptr(2), 3), dict(BLOCK=64), num_warps=4)
    assert len(warmed) == 1 and not launch.ready("key")


def test_descriptor_arguments_take_tritons_launcher(direct):
    """A kernel with tensor-descriptor arguments is launched by Triton's own (encoding) launcher
    when called as ``launch(...)``: only :class:`FlatLaunch` callers pass encoded descriptors."""
    launch, calls = direct
    ran: list = []
    compiled = SimpleNamespace(function="f", packed_metadata="meta", run=lambda *a: ran.append(a))
    launch._compiled[(0, "desc key")] = (compiled, (64,), (print, ("coop", "pdl"), {0: {"swizzle": 128}}, None),
                                         dict(BLOCK=64))
    ptr = _Ptr(5)
    launch("desc key", (1, 1, 1), ("desc", ptr, 1), dict(BLOCK=64), num_warps=4)
    assert calls == [] and ran == [(1, 1, 1, 0xABC, "f", "meta", None, None, None, "desc", ptr, 1, 64)]


def test_tma_arg_encodes_an_address_with_the_kernels_metadata(monkeypatch):
    seen: list = []
    utils = SimpleNamespace(fill_tma_descriptor=lambda *a: seen.append(a) or "tensormap")
    monkeypatch.setattr(_launch, "driver", SimpleNamespace(active=SimpleNamespace(utils=utils)))
    meta = {"swizzle": 128, "elem_size": 2, "elem_type": 10, "block_size": [1, 64, 256], "fp4_padded": False}
    spec = TmaSpec.of(meta, (4, 128, 512), (65536, 512, 1))
    assert _launch.tma_arg(spec, 0x1000) == ("tensormap", 4, 128, 512, 65536, 512, 1)
    address, swizzle, elem, dtype, box, shape, strides, padding = seen[0]
    # the driver's element-type code of the kernel's (10 -> 9), the sequences passed as the spec's tuples
    assert (address, swizzle, elem, dtype, box, shape, strides, padding) == (0x1000, 128, 2, 9, (1, 64, 256),
                                                                              (4, 128, 512), (65536, 512, 1), 0)
    assert spec == spec and spec != TmaSpec.of(meta, [4, 128, 512], [65536, 512, 1])    # identity: kept by its owner
    with pytest.raises(ValueError, match="metadata"):
        TmaSpec.of(None, (1,), (1,))
    # the per-call form (shapes and strides of this call, the kernel's fields converted once) passes the same
    box = _launch.tma_box(meta)
    assert box == (128, 2, 9, (1, 64, 256))
    assert _launch.tma_arg_of(box, 0x1000, (4, 128, 512), (65536, 512, 1)) == ("tensormap", 4, 128, 512, 65536, 512, 1)
    assert seen[1] == seen[0]
    with pytest.raises(ValueError, match="metadata"):
        _launch.tma_box({**meta, "fp4_padded": True})


def test_an_owner_keeps_encodings_per_spec_and_address_and_bounds_them():
    dec = AbsorbedDecode("cpu")
    encoded: list = []

    def encode(spec, address):
        encoded.append((spec, address))
        return (address,)

    for _ in range(3):
        for addr in (0x2000, 0x6000):
            assert dec.tma("spec", addr, encode) == (addr,)
    assert encoded == [("spec", 0x2000), ("spec", 0x6000)]
    for i in range(2 * dec.MAX_ENCODINGS):
        dec.tma("spec", 0x10000 + 16 * i, encode)
    assert len(dec._tma) <= dec.MAX_ENCODINGS
    assert AbsorbedDecode("cpu")._tma == {}          # two objects never share state


def _plan(starts: bool, packed: bool, known=None):
    rb = None if known is None else SimpleNamespace(get=lambda: known)
    plan = SimpleNamespace(starts="starts" if starts else None, packed="flag" if packed else None, kind_readback=rb,
                           items=torch.empty(0))
    from mla_var3.kernel.decode_plan import DecodePlan
    plan.known_kind = lambda: DecodePlan.known_kind(plan)
    return plan


def test_the_seesaw_compiles_every_launch_a_plan_may_take_and_launches_what_it_takes_now():
    """A plan whose kind the GPU chooses compiles three launches at once (the gated pair and the
    packed kernel alone), so a capture after eager calls never compiles; it launches the pair
    until its kind has landed on the host, then the chosen kernel alone (a capture never sees
    the kind: :meth:`DecodePlan.known_kind`, checked on the GPU)."""
    host = pytest.importorskip("mla_var3.kernel.hopper.seesaw_host")
    spec = host.SeesawSpec
    assert spec.kinds_of(None, _plan(False, False)) == (host._ITEM,)
    assert spec.kinds_of(None, _plan(True, False)) == (host._PACKED,)
    gated_all = spec.kinds_of(None, _plan(True, True))
    assert set(gated_all) == {host._GATED_ITEM, host._GATED_PACKED_AFTER, host._GATED_PACKED}
    assert spec.launches_for(_plan(True, True)) == host._GATED_PAIR                       # no readback
    assert spec.launches_for(_plan(True, True, known=None)) == host._GATED_PAIR
    assert spec.launches_for(_plan(True, True, known=True)) == (host._GATED_PACKED,)
    assert spec.launches_for(_plan(True, True, known=False)) == (host._GATED_ITEM,)
    for known in (True, False):
        assert set(spec.launches_for(_plan(True, True, known=known))) <= set(gated_all)


def _fake_compiled(launch, signature):
    run = SimpleNamespace(launch=launch, global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                          launch_pdl=False)
    return SimpleNamespace(run=run, src=SimpleNamespace(signature=signature, constants={}),
                           metadata=SimpleNamespace(tensordesc_meta=None), packed_metadata="packed")


def test_direct_launcher_found_with_and_without_descriptor_arguments():
    """Triton calls its C launcher unwrapped for a kernel without tensor-descriptor arguments
    (the combine, the planner) and through an encoding wrapper otherwise; both take the direct path."""
    raw = print                                          # any builtin stands for the C launcher
    found = _launch._direct_launcher(_fake_compiled(raw, {"x_ptr": "*fp32", "n": "i32"}))
    assert found is not None and found[0] is raw and found[2] == {}

    def wrapper(*args):                                  # Triton's wrap_handle_tensordesc closure
        return raw(*args)

    sig = {"a_desc": "tensordesc<bf16[64, 64]>", "x_ptr": "*fp32"}
    found = _launch._direct_launcher(_fake_compiled(wrapper, sig))
    assert found is not None and found[0] is raw and list(found[2]) == [0]
    assert found[3] is None                              # no usable descriptor metadata: no boxes to encode with
    meta = {"swizzle": 128, "elem_size": 2, "elem_type": 10, "block_size": [64, 64], "fp4_padded": False}
    with_meta = _fake_compiled(wrapper, sig)
    with_meta.metadata.tensordesc_meta = [meta]
    found = _launch._direct_launcher(with_meta)
    assert found[2] == {0: meta} and found[3] == {0: (128, 2, 9, (64, 64))}   # the boxes, converted once
    assert _launch._direct_launcher(_fake_compiled(lambda *a: None, sig)) is None   # not the expected shape


def test_the_seesaw_signature_tells_apart_every_specialisation_and_no_address():
    """A call's launch spec is kept per signature: any change of a tensor's shape, strides or
    dtype, of the flags, or of an input's 16-byte alignment gives another signature; the same
    layout at other addresses gives the same one (the spec holds no address)."""
    host = pytest.importorskip("mla_var3.kernel.hopper.seesaw_host")
    q = torch.zeros(2, 3, 4, 512, dtype=torch.bfloat16)
    qpe = torch.zeros(2, 3, 4, 64, dtype=torch.bfloat16)
    z, kpe = torch.zeros(2, 100, 512, dtype=torch.bfloat16), torch.zeros(2, 100, 64, dtype=torch.bfloat16)
    lens = torch.zeros(2, dtype=torch.int32)
    sig = lambda q=q, qpe=qpe, keys=(z, kpe), table=None, lens=lens, causal=True, head_major=True: (  # noqa: E731
        host._signature(q, qpe, keys, table, lens, causal, head_major))
    base = sig()
    assert base == sig(q=q.clone(), qpe=qpe.clone(), keys=(z.clone(), kpe.clone()), lens=lens.clone())
    padded = torch.zeros(3, dtype=torch.int32)
    variants = [sig(q=q[:, :, :2]), sig(q=q.transpose(1, 2)), sig(q=q.half()), sig(keys=(z[:, :50], kpe)),
                sig(lens=None), sig(lens=padded[1:]), sig(causal=False), sig(head_major=False),
                sig(table=torch.zeros(2, 6, dtype=torch.int32))]
    assert len({base, *variants}) == len(variants) + 1
    assert not any(isinstance(x, int) and x > 1 << 20 for x in _flatten(base))   # no address in it


def _flatten(x):
    if isinstance(x, (tuple, list, torch.Size)):
        for y in x:
            yield from _flatten(y)
    else:
        yield x
