"""The direct launch path (:mod:`mla_var3.kernel._launch`) and the seesaw call's repeat, checked
without a GPU: the compiled kernel's C launcher is replaced by a recorder, so what a bound launch
passes can be compared with what the ordinary direct path passes for the same arguments."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from mla_var3.kernel import _launch
from mla_var3.kernel._launch import Address, BoundLaunch, CachedLaunch

#: the plan of a repeat whose kind the host fixed (nothing to read back)
_NO_READBACK = SimpleNamespace(kind_readback=None)


@triton.jit
def _toy(a_desc, o_desc, x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


@dataclasses.dataclass
class _Desc:
    """Stands for a Gluon TensorDescriptor (the fields the launch path reads)."""

    base: object
    shape: list
    strides: list
    block_shape: list
    layout: str = "nvmma"


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
    import triton.backends.nvidia.driver as nv

    calls: list[tuple] = []
    monkeypatch.setattr(_launch, "interpreting", lambda: False)
    monkeypatch.setattr(_launch, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda index: 0xABC)))
    encoded: list[int] = []

    def fake_encode(desc, meta):
        encoded.append(desc.base.data_ptr())
        return [("tensormap", desc.base.data_ptr(), tuple(desc.shape), meta), *desc.shape, *desc.strides]

    monkeypatch.setattr(nv, "make_tensordesc_arg", fake_encode)
    launch = CachedLaunch(_toy)
    compiled = SimpleNamespace(function="cufunction")
    raw = lambda *args: calls.append(args)  # noqa: E731
    launch._compiled[(0, "key")] = (compiled, (64,), (raw, ("coop", "pdl"), {0: "meta-a", 1: "meta-o"}))
    return launch, calls, encoded


def _args(o_addr: int, y_addr: int) -> tuple:
    a = _Desc(Address(0x1000, torch.bfloat16), [4, 64, 256], [16384, 256, 1], [1, 64, 128])
    o = _Desc(Address(o_addr, torch.bfloat16), [4, 64, 256], [16384, 256, 1], [1, 64, 128])
    return a, o, _Ptr(0x3000), _Ptr(y_addr), 17


def test_bound_launch_passes_what_the_direct_path_passes(direct):
    launch, calls, _ = direct
    assert launch.ready("key")
    bound = launch.bind("key", (2, 3, 1), _args(0x2000, 0x4000), (1, 3))
    assert isinstance(bound, BoundLaunch)
    for o_addr, y_addr in ((0x2000, 0x4000), (0x8000, 0x9000), (0x2000, 0x4000)):
        calls.clear()
        launch("key", (2, 3, 1), _args(o_addr, y_addr), dict(BLOCK=64), num_warps=4)
        bound(0xABC, o_addr, y_addr)
        want, got = calls
        # the direct path passes the pointer objects, the bound launch their addresses
        want = tuple(a.data_ptr() if isinstance(a, _Ptr) else a for a in want)
        assert got == want
        assert got[:5] == (2, 3, 1, 0xABC, "cufunction") and got[-1] == 64
        assert ("tensormap", o_addr, (4, 64, 256), "meta-o") in got and y_addr in got


def test_bound_launch_encodes_each_output_address_once(direct):
    launch, calls, encoded = direct
    bound = launch.bind("key", (1, 1, 1), _args(0x2000, 0x4000), (1, 3))
    encoded.clear()
    for _ in range(3):
        for addr in (0x2000, 0x6000):
            bound(0xABC, addr, 0x4000)
    assert encoded == [0x2000, 0x6000]
    assert len(calls) == 6


def test_bound_launch_keeps_one_argument_tuple_per_stream_and_addresses(direct):
    """The launcher's arguments are built once per (stream, addresses), never reused for other
    ones, and the kept tuples are bounded."""
    launch, calls, _ = direct
    bound = launch.bind("key", (1, 1, 1), _args(0x2000, 0x4000), (1, 3))
    bound(0xABC, 0x2000, 0x4000)
    bound(0xDEF, 0x2000, 0x4000)
    bound(0xABC, 0x2000, 0x5000)
    bound(0xABC, 0x2000, 0x4000)
    first, other_stream, other_addr, again = calls
    assert again == first and other_stream[3] == 0xDEF and other_stream[4:] == first[4:]
    diff = [i for i, (x, y) in enumerate(zip(first, other_addr)) if x != y]
    assert len(other_addr) == len(first) and len(diff) == 1
    assert (first[diff[0]], other_addr[diff[0]]) == (0x4000, 0x5000)
    assert len(bound.flat) == 3
    for i in range(2 * BoundLaunch.MAX_ARG_TUPLES):
        bound(0xABC, 0x2000, 0x10000 + 16 * i)
    assert len(bound.flat) <= BoundLaunch.MAX_ARG_TUPLES
    calls.clear()
    bound(0xABC, 0x2000, 0x4000)               # rebuilt after the bound, the same arguments
    assert calls == [first]


def test_prepare_compiles_without_launching_then_the_key_binds(direct, monkeypatch):
    """``prepare`` compiles through the kernel's warm-up (no launch), once per key; the key is
    then ready and binds; under the interpreter it does nothing."""
    launch, calls, _ = direct
    warmed: list = []
    compiled = SimpleNamespace(function="cufunction-2")
    monkeypatch.setattr(_launch, "_direct_launcher", lambda c: (lambda *a: calls.append(a), ("coop", "pdl"),
                                                                  {0: "meta-a", 1: "meta-o"}))
    monkeypatch.setattr(launch, "fn", SimpleNamespace(warmup=lambda *args, grid, **kw: warmed.append((grid, kw))
                                                      or compiled))
    launch._const_names = ["BLOCK"]
    assert not launch.ready("new key")
    for _ in range(2):
        launch.prepare("new key", (2, 3, 1), _args(0x2000, 0x4000), dict(BLOCK=64), num_warps=4)
    assert warmed == [((2, 3, 1), dict(BLOCK=64, num_warps=4))] and calls == []
    assert launch.ready("new key")
    launch.bind("new key", (2, 3, 1), _args(0x2000, 0x4000), (1, 3))(0xABC, 0x2000, 0x4000)
    assert calls[0][4] == "cufunction-2" and calls[0][-1] == 64
    monkeypatch.setattr(_launch, "interpreting", lambda: True)
    launch.prepare("third key", (1, 1, 1), _args(0x2000, 0x4000), dict(BLOCK=64), num_warps=4)
    assert len(warmed) == 1


def test_bind_refuses_what_is_not_on_the_direct_path(direct, monkeypatch):
    launch, _, _ = direct
    with pytest.raises(ValueError, match="compiled for this key"):
        launch.bind("other key", (1, 1, 1), _args(0x2000, 0x4000), (1, 3))
    with pytest.raises(ValueError, match="outside"):
        launch.bind("key", (1, 1, 1), _args(0x2000, 0x4000), (1, 9))
    monkeypatch.setattr(_launch, "interpreting", lambda: True)
    assert not launch.ready("key")


def test_repeat_binds_after_its_first_run_and_falls_back_when_the_context_changes(monkeypatch):
    """The seesaw repeat (``_Repeat``): the first call runs the ordinary repeat and binds; later
    calls on the same stream and workspace take the two bound launches; another stream, a new
    workspace or a CUDA-graph capture take the ordinary repeat again."""
    ss = pytest.importorskip("mla_var3.kernel.hopper.absorbed_seesaw")
    state = dict(stream=1, capturing=False)
    monkeypatch.setattr(ss, "current_stream", lambda index: state["stream"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(ss, "_WORKSPACES", {(None, 1): "ws1", (None, 2): "ws2"})
    log: list = []

    def slow():
        log.append("slow")
        return torch.zeros(2, 3, 1, 8), torch.zeros(2, 3, 1)

    def binder(o, l_out):
        log.append("bind")
        return (lambda stream, o_ptr, l_ptr: log.append(("kernel", stream)),
                lambda stream, o_ptr, l_ptr: log.append(("combine", stream)))

    rep = ss._Repeat(slow, binder, (2, 3, 1, 8), True, torch.float32, torch.device("cpu"), _NO_READBACK)
    o, lse = rep()
    assert log == ["slow", "bind"] and o.shape == (2, 3, 1, 8)
    log.clear()
    o, lse = rep()
    assert log == [("kernel", 1), ("combine", 1)] and o.shape == (2, 3, 1, 8) and lse.shape == (2, 3, 1)
    log.clear()
    state["stream"] = 2                        # another stream: its own workspace, bind again
    rep()
    rep()
    assert log == ["slow", "bind", ("kernel", 2), ("combine", 2)]
    log.clear()
    ss._WORKSPACES[(None, 2)] = "grown"        # the workspace was replaced
    rep()
    assert log == ["slow", "bind"]
    log.clear()
    state["capturing"] = True                  # in a capture: the ordinary path, nothing bound
    rep()
    rep()
    assert log == ["slow", "slow"]
    log.clear()
    state["capturing"] = False
    rep()
    rep()
    assert log == ["slow", "bind", ("kernel", 2), ("combine", 2)]


def test_repeat_binds_again_once_the_plan_kind_has_landed(monkeypatch):
    """Launches bound while the plan's kind was on its way to the host are bound once more when
    it lands (the binder then binds the chosen kernel alone), and never again after that."""
    from mla_var3.kernel.decode_plan import KindReadback

    ss = pytest.importorskip("mla_var3.kernel.hopper.absorbed_seesaw")
    monkeypatch.setattr(ss, "current_stream", lambda index: 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(ss, "_WORKSPACES", {(None, 1): "ws"})
    event = SimpleNamespace(done=False)
    event.query = lambda: event.done
    plan = SimpleNamespace(kind_readback=KindReadback(torch.tensor([1]), event))
    log: list = []

    def slow():
        log.append("slow")
        return torch.zeros(2, 3, 1, 8), torch.zeros(2, 3, 1)

    def binder(o, l_out):
        kind = plan.kind_readback.get()
        log.append(("bind", kind))
        return (lambda stream, o_ptr, l_ptr: log.append(("kernels", kind)),)

    rep = ss._Repeat(slow, binder, (2, 3, 1, 8), True, torch.float32, torch.device("cpu"), plan)
    rep()
    rep()
    assert log == ["slow", ("bind", None), ("kernels", None)]
    log.clear()
    event.done = True
    rep()
    rep()
    rep()
    assert log == ["slow", ("bind", True), ("kernels", True), ("kernels", True)]


@pytest.mark.parametrize("head_major", [True, False])
@pytest.mark.parametrize("s", [4, 1])
def test_repeat_returns_both_row_orders(monkeypatch, head_major, s):
    """``repeat()`` gives [B, H, S, K] and ``token_major()`` [B, S, H, K], on the bound path and on
    the ordinary one, whichever order the kernel writes (a token-major buffer is [B, S, H, K];
    at S = 1 a token-major repeat allocates [B, 1, H, K] for the kernel's head-major rows)."""
    ss = pytest.importorskip("mla_var3.kernel.hopper.absorbed_seesaw")
    monkeypatch.setattr(ss, "current_stream", lambda index: 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(ss, "_WORKSPACES", {(None, 1): "ws"})
    b, h, k = 2, 3, 8
    written = torch.arange(b * h * s * k, dtype=torch.float32).view(b, h, s, k)

    def slow():   # the ordinary repeat returns [B, H, S, K] views of the order the kernel writes
        x = written.clone() if head_major else written.transpose(1, 2).contiguous()
        return (x if head_major else x.transpose(1, 2)), torch.zeros(b, h, s)

    def fill(stream, x_ptr, l_ptr):   # the bound kernel writes the buffer at x_ptr in its row order
        src = written if head_major else written.transpose(1, 2).contiguous()
        for x in allocated:
            if x.data_ptr() == x_ptr:
                assert x.is_contiguous()
                x.view(-1).copy_(src.reshape(-1))

    allocated: list = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: allocated.append(real_empty(*a, **kw)) or allocated[-1])
    rep = ss._Repeat(slow, lambda o, l_out: (fill,), (b, h, s, k), head_major, torch.float32, torch.device("cpu"),
                     _NO_READBACK)
    for _ in range(2):                 # ordinary, then bound
        o, lse = rep()
        assert o.shape == (b, h, s, k) and torch.equal(o, written) and lse.shape == (b, h, s)
        o, _ = rep.token_major()
        assert o.shape == (b, s, h, k) and torch.equal(o, written.transpose(1, 2))
    assert rep.bound is not None


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
    assert _launch._direct_launcher(_fake_compiled(lambda *a: None, sig)) is None   # not the expected shape


def test_the_replay_key_tells_apart_every_input_that_changes_the_call(monkeypatch):
    """A repeated decode call is found by this key and then skips every check: any change of an
    input's address, shape, strides or dtype, of the scale, the mask or the plan's identity must
    give another key; checked mode and a missing required tensor give none."""
    from mla_var3.kernel._common import CHECK_ENV
    from mla_var3.kernel.absorbed import _replay_key

    monkeypatch.delenv(CHECK_ENV, raising=False)
    q = torch.zeros(2, 3, 4, 8, dtype=torch.bfloat16)
    cache = torch.zeros(5, 4, 1, 8, dtype=torch.bfloat16)
    table = torch.zeros(2, 6, dtype=torch.int32)
    lens = torch.zeros(2, dtype=torch.int32)
    plan, other_plan = object(), object()
    key = lambda *ts, scale=0.5, causal=True, extra=(plan, 4): _replay_key("compat", ts, scale, causal, extra)
    base = key(q, cache, table, lens)
    assert base is not None and base == key(q, cache, table, lens)
    variants = [key(q.clone(), cache, table, lens), key(q.view(2, 3, 8, 4), cache, table, lens),
                key(q.transpose(1, 2), cache, table, lens), key(q.half(), cache, table, lens),
                key(q, cache, table[:, :5], lens), key(q, cache, table, lens.clone()),
                key(q, cache, table, lens, scale=0.25), key(q, cache, table, lens, causal=False),
                key(q, cache, table, lens, extra=(other_plan, 4)), key(q, cache, table, lens, extra=(plan, 2))]
    assert all(v is not None for v in variants)
    assert len({base, *variants}) == len(variants) + 1
    assert key(q, cache, None, lens) is None                      # a required tensor missing: no repeat
    dense = _replay_key("dense", (q, q, cache, cache, None), 0.5, True, None)   # dense without lengths
    assert dense is not None and dense != _replay_key("dense", (q, q, cache, cache, lens), 0.5, True, None)
    monkeypatch.setenv(CHECK_ENV, "1")
    assert key(q, cache, table, lens) is None                     # checked mode: every call is checked
