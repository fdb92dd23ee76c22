"""Decode state the caller owns (:class:`mla_var3.kernel.decode.AbsorbedDecode`, the compat
metadata, the layer's :class:`AttentionState`): a plan is reused only for the lengths it was
built from, two objects share nothing, the module keeps no state, bad reuse is a clear error,
and nothing depends on torch's default device or dtype.

Small shapes, run by the kernels (Triton's interpreter on a CPU, the GPU's kernels on a GPU)
against the fp32 references; NaN-poisoned caches past every length.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import mla_var3
from mla_var3 import reference as ref
from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
from mla_var3.kernel.absorbed import flash_mla, flash_mla_paged
from mla_var3.kernel.decode import AbsorbedDecode
from mla_var3.kernel.decode_plan import plan_decode
from mla_var3.shapes import Problem, get_preset
from mla_var3.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIMS = get_preset("deepseek-v3").replace(h=16)
K, P = DIMS.k, DIMS.p
SRC = pathlib.Path(mla_var3.__file__).parent


def _paged(b, s_q, t, lengths, seed=0):
    x = ref.make_inputs(DIMS, Problem(b=b, s=s_q, t=t), dtype=torch.bfloat16, device=DEVICE, seed=seed)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    cache, table = ref.make_paged(x.z, x.kpe, seqlens, page_block_size=64, seed=seed)
    return x, cache, table, seqlens


def _poison_past(cache, table, seqlens, page=64):
    """NaN in every cache row past each sequence's length (a kernel that reads one fails)."""
    cache = cache.clone()
    for b, n in enumerate(seqlens.tolist()):
        for j in range(table.shape[1]):
            lo = max(0, n - j * page)
            if lo < page:
                cache[int(table[b, j]), lo:] = float("nan")
    return cache


def _check(out, lse, x, cache, table, seqlens, causal=True, token_major=False):
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, (K + P) ** -0.5, causal)
    assert_close(out, ro.transpose(1, 2) if token_major else ro, torch.bfloat16, name="out")
    assert_close(lse, rl, tol=1e-4, name="lse")


def test_compat_metadata_reused_with_other_lengths_plans_again():
    """Issue H: a metadata whose first call planned lengths (30, 20) is reused by a step whose
    lengths are (100, 90) (a new tensor, then the same one written in place): every key is
    attended, not just the planned ones."""
    x, cache, table, seqlens = _paged(2, 1, 128, [100, 90])
    cache = _poison_past(cache, table, seqlens)
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()
    meta, _ = get_mla_metadata()
    short = torch.tensor([30, 20], dtype=torch.int32, device=DEVICE)
    flash_mla_with_kvcache(q, cache, table, short, K, meta, causal=True)
    first_plan = meta.plan
    out, lse = flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=True)    # another tensor
    assert meta.plan is not first_plan
    _check(out, lse, x, cache, table, seqlens, token_major=True)
    short.copy_(seqlens)                                                                  # in place
    out, lse = flash_mla_with_kvcache(q, cache, table, short, K, meta, causal=True)
    _check(out, lse, x, cache, table, seqlens, token_major=True)


def test_a_plan_is_reused_for_the_same_lengths_and_rebuilt_for_others():
    x, cache, table, seqlens = _paged(2, 2, 128, [128, 70])
    dec = AbsorbedDecode(DEVICE)
    plan = dec.plan(seqlens, rows=DIMS.h * 2, capacity=table.shape[1] * 64)
    for _ in range(2):                                   # a step's layers: the same plan, no replanning
        out, lse = dec.run_paged(x.qc, x.qpe, cache, table, seqlens, scale=(K + P) ** -0.5)
        assert dec.decode_plan is plan
        _check(out, lse, x, cache, table, seqlens)
    seqlens[0] = 100                                     # the next step writes its lengths in place
    out, lse = dec.run_paged(x.qc, x.qpe, cache, table, seqlens, scale=(K + P) ** -0.5)
    assert dec.decode_plan is not plan
    _check(out, lse, x, cache, table, seqlens)
    other = AbsorbedDecode(DEVICE)                       # two objects share nothing
    assert other.decode_plan is None and other._workspaces == {} and other._tma == {} and other._bound == {}


def test_bound_launches_are_dropped_with_their_plan_or_workspace_and_bounded(monkeypatch):
    """An owner's bound launches point into its plan and workspace: a new plan and a grown
    workspace drop them all, and the store never outgrows MAX_BOUND."""
    x, cache, table, seqlens = _paged(2, 1, 128, [128, 70])
    dec = AbsorbedDecode(DEVICE)
    first = dec.plan(seqlens, rows=DIMS.h, capacity=table.shape[1] * 64)
    dec.bind(("layer", 0), "bound")
    assert dec.bound(("layer", 0)) == "bound"
    dec.plan_for(seqlens, seqlens, 2, DIMS.h, table.shape[1] * 64, k=K, device=first.items.device)
    assert dec.decode_plan is first and dec.bound(("layer", 0)) == "bound"        # the same plan: kept
    dec.plan(seqlens, rows=DIMS.h, capacity=table.shape[1] * 64)                    # a new plan: dropped
    assert dec.bound(("layer", 0)) is None
    for i in range(AbsorbedDecode.MAX_BOUND + 5):
        dec.bind(("layer", i), i)
    assert 0 < len(dec._bound) <= AbsorbedDecode.MAX_BOUND
    if DEVICE == "cuda":                                 # a workspace grown on a stream: dropped too
        stream, dev = torch.cuda.current_stream().cuda_stream, first.items.device
        dec.workspace(1, 16, K, dev, stream)
        dec.bind(("layer", 0), "bound")
        dec.workspace(1, 16, K, dev, stream)                                       # fits: kept
        assert dec.bound(("layer", 0)) == "bound"
        dec.workspace(1, 16, K, torch.device("cuda"), stream)                      # the same device named
        assert dec.bound(("layer", 0)) == "bound"                                  # without its index: kept
        dec.workspace(4, 64, K, dev, stream)                                       # grown: dropped
        assert dec.bound(("layer", 0)) is None
    if DEVICE == "cuda":                                 # the fast path binds, and reuses what it bound
        monkeypatch.delenv("MLA_VAR3_CHECK", raising=False)         # value checks keep calls off the fast path
        for _ in range(3):
            out, lse = dec.run_paged(x.qc, x.qpe, cache, table, seqlens, scale=(K + P) ** -0.5)
            _check(out, lse, x, cache, table, seqlens)
        assert dec._bound                               # bound by the fast path (one per plan kind launched)


def test_a_transient_owner_keeps_no_encodings_and_binds_nothing(monkeypatch):
    """An object made for one call (an entry point called without the caller's) encodes each
    descriptor afresh and binds no launches; its calls give the same results."""
    x, cache, table, seqlens = _paged(2, 1, 128, [128, 70])
    dec = AbsorbedDecode.for_one_call(DEVICE)
    assert dec.transient and not dec.readback
    calls = []
    assert dec.tma("spec", 16, lambda spec, a: calls.append(a) or ("enc", a)) == ("enc", 16)
    assert dec.tma("spec", 16, lambda spec, a: calls.append(a) or ("enc", a)) == ("enc", 16)
    assert calls == [16, 16] and dec._tma == {}
    dec.bind(("layer", 0), "bound")
    assert dec.bound(("layer", 0)) is None and dec._bound == {}
    monkeypatch.delenv("MLA_VAR3_CHECK", raising=False)
    for _ in range(2):
        out, lse = dec.run_paged(x.qc, x.qpe, cache, table, seqlens, scale=(K + P) ** -0.5)
        _check(out, lse, x, cache, table, seqlens)
    assert dec._tma == {} and dec._bound == {}


def test_a_callers_plan_for_other_lengths_is_refused():
    x, cache, table, seqlens = _paged(2, 1, 128, [128, 70])
    plan = plan_decode(seqlens, DIMS.h, capacity=table.shape[1] * 64)
    out, lse = flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, scale=(K + P) ** -0.5, plan=plan)
    _check(out, lse, x, cache, table, seqlens)
    other = seqlens.clone()
    other[1] = 60
    with pytest.raises(ValueError, match="other lengths"):
        flash_mla_paged(x.qc, x.qpe, cache, table, other, scale=(K + P) ** -0.5, plan=plan)
    with pytest.raises(ValueError, match="either plan or decode"):
        flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, scale=(K + P) ** -0.5, plan=plan,
                        decode=AbsorbedDecode(DEVICE))
    with pytest.raises(ValueError, match="AbsorbedDecode"):
        flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, scale=(K + P) ** -0.5, decode=object())


def test_a_dense_uniform_plan_is_kept_per_length():
    """A dense call without lengths plans on the host per 64-key block count; the object keeps
    it for calls of the same length and plans again for another."""
    x = ref.make_inputs(DIMS, Problem(b=2, s=1, t=130), dtype=torch.bfloat16, device=DEVICE, seed=1)
    dec = AbsorbedDecode(DEVICE)
    scale = (K + P) ** -0.5
    out, lse = flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=scale, decode=dec)
    plan = dec.decode_plan
    flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=scale, decode=dec)
    assert dec.decode_plan is plan
    ro, rl = ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, scale, True)
    assert_close(out, ro, torch.bfloat16)
    out, lse = flash_mla(x.qc, x.qpe, x.z[:, :60], x.kpe[:, :60], scale=scale, decode=dec)
    assert dec.decode_plan is not plan
    ro, rl = ref.flash_mla(x.qc, x.qpe, x.z[:, :60], x.kpe[:, :60], scale, True)
    assert_close(out, ro, torch.bfloat16)


def test_uniform_plans_are_kept_for_the_process_and_never_evicted(monkeypatch):
    """The host plans of uniform batches live as long as the process once made (a captured graph
    reads them with no reference of its own); when the memo is full, new shapes are planned at
    every call and never kept, and what is kept stays."""
    from mla_var3.kernel import plan_reference as pr

    monkeypatch.setattr(pr, "_UNIFORM", {})
    monkeypatch.setattr(pr, "MAX_UNIFORM_PLANS", 2)
    assert pr.kept_uniform_plan(2, 16, 640, sms=8) is None
    first = pr.uniform_plan(2, 16, 640, sms=8)
    assert pr.kept_uniform_plan(2, 16, 600, sms=8) is first          # the same 64-key block count
    assert pr.uniform_plan(2, 16, 641, sms=8) is pr.kept_uniform_plan(2, 16, 641, sms=8) is not first
    third = pr.uniform_plan(3, 16, 640, sms=8)                       # the memo is full: not kept
    assert pr.kept_uniform_plan(3, 16, 640, sms=8) is None and pr.uniform_plan(3, 16, 640, sms=8) is not third
    assert pr.kept_uniform_plan(2, 16, 640, sms=8) is first
    split = pr.uniform_plan(2, 16, 640, sms=8, num_splits=2)                # forced splits (autotuning): an
    assert split is not first and all(p is not split for p in pr._UNIFORM.values())   # evictable cache, not the memo
    assert pr.kept_uniform_plan(2, 16, 640, sms=8) is first


def test_a_capture_takes_the_kept_uniform_plan_and_plans_on_the_device_without_one(monkeypatch):
    """Inside a CUDA-graph capture a dense call without lengths cannot copy a host plan to the
    device: it takes the plan an eager call kept for its shape (no planner kernel in the graph),
    and builds one on the device only when none was kept."""
    from mla_var3.kernel import decode as decode_mod
    from mla_var3.kernel import plan_reference as pr

    monkeypatch.setattr(pr, "_UNIFORM", {})
    monkeypatch.setattr(decode_mod, "_capturing", lambda device: True)
    built = []
    real_build = decode_mod.build_plan
    monkeypatch.setattr(decode_mod, "build_plan", lambda *a, **kw: built.append((a, kw)) or real_build(*a, **kw))
    device = torch.device(DEVICE)
    plan = AbsorbedDecode(device).plan_for(None, None, 2, 16, 640, k=64, device=device)
    assert len(built) == 1 and built[0][0][0] is None and built[0][1]["packed"] is False
    assert pr.kept_uniform_plan(2, 16, 640, k=64, device=device) is None      # nothing kept by the capture
    eager = pr.uniform_plan(2, 16, 640, k=64, device=device)
    got = AbsorbedDecode(device).plan_for(None, None, 2, 16, 640, k=64, device=device)
    assert got is eager and len(built) == 1
    assert plan.batch == got.batch == 2 and plan.max_blocks == got.max_blocks == 10


@pytest.mark.parametrize("bad", [True, "0.1", float("nan"), float("inf"), -1.0, 0])
def test_compat_scale_must_be_a_positive_number(bad):
    """Issue J: ``flash_mla_with_kvcache(q, k, tb, sl, 512, meta, None, True)`` put ``causal``
    in the scale's place and ran with scale 1.0."""
    x, cache, table, seqlens = _paged(1, 1, 64, [64])
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_mla_with_kvcache(q, cache, table, seqlens, K, None, None, bad)


@pytest.mark.parametrize("change,match", [
    (lambda c: c.update(seqlens=c["seqlens"].float()), "cache_seqlens"),
    (lambda c: c.update(seqlens=c["seqlens"][:1]), "cache_seqlens"),
    (lambda c: c.update(table=c["table"].long()), "block_table"),
    (lambda c: c.update(cache=c["cache"][..., :-64]), "k_cache|q"),
])
def test_compat_errors_name_the_callers_arguments(change, match):
    """Issue L: the checks named ``kv_cache`` and ``seqlens`` where the caller passed
    ``k_cache`` and ``cache_seqlens``."""
    x, cache, table, seqlens = _paged(2, 1, 64, [64, 10])
    c = dict(cache=cache, table=table, seqlens=seqlens)
    change(c)
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()
    with pytest.raises(ValueError, match=match) as err:
        flash_mla_with_kvcache(q, c["cache"], c["table"], c["seqlens"], K, None, causal=True)
    assert "kv_cache" not in str(err.value) and "seqlens must" not in str(err.value).replace("cache_seqlens", "")


@pytest.mark.parametrize("h,s_q", [(0, 1), (16, 0)])
def test_no_rows_gives_empty_outputs(h, s_q):
    """Issue M: 0 heads or s_q = 0 returned 'rows (h * s) must be >= 1' from the planner."""
    x, cache, table, seqlens = _paged(2, 1, 64, [64, 10])
    q = torch.zeros(2, s_q, h, K + P, dtype=torch.bfloat16, device=DEVICE)
    meta, _ = get_mla_metadata()
    out, lse = flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=True)
    assert out.shape == (2, s_q, h, K) and lse.shape == (2, h, s_q)
    qc = torch.zeros(2, h, s_q, K, dtype=torch.bfloat16, device=DEVICE)
    qpe = torch.zeros(2, h, s_q, P, dtype=torch.bfloat16, device=DEVICE)
    out, lse = flash_mla_paged(qc, qpe, cache, table, seqlens, scale=0.1)
    assert out.shape == (2, h, s_q, K) and lse.shape == (2, h, s_q)


@pytest.mark.parametrize("default", [torch.bfloat16, torch.float64])
def test_no_call_depends_on_the_default_dtype(default):
    """Issue 45: every tensor the package makes names its dtype or takes it from an input; the
    compat call, the dense call and a layer step run as under float32 defaults."""
    from mla_var3.model import MLAConfig, MLALayer

    x, cache, table, seqlens = _paged(2, 2, 100, [100, 40])
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()
    cfg = MLAConfig.from_preset("deepseek-v3").scaled(div=4, h=4)     # widths the kernels take (P = 16)
    wdt = torch.bfloat16 if DEVICE == "cuda" else torch.float32       # the kernels' dtypes on each
    layer = MLALayer.random(cfg, dtype=wdt, seed=0).to(DEVICE)
    hidden = torch.randn(2, 3, cfg.hidden, dtype=wdt, device=DEVICE)
    pos = torch.arange(3, device=DEVICE).expand(2, 3)
    with torch.no_grad():
        want_layer = layer(hidden, pos, mode="absorbed")[0]
    meta, _ = get_mla_metadata()
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        out, lse = flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=True)
        dense, _ = flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=(K + P) ** -0.5, seqlens=seqlens)
        with torch.no_grad():
            got_layer = layer(hidden, pos, mode="absorbed")[0]
    finally:
        torch.set_default_dtype(before)
    _check(out, lse, x, cache, table, seqlens, token_major=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and dense.dtype == torch.bfloat16
    assert got_layer.dtype == wdt
    assert_close(got_layer, want_layer, tol=1e-5 if wdt == torch.float32 else 1e-3, name="layer step")


# --- no state in the modules of the decode path ---------------------------------------------

#: module-level names on the decode path that may hold mutable containers, and why
ALLOWED = {
    ("kernel/backends.py", "_REGISTRY"): "the backend registry (which implementation runs on which device)",
    ("kernel/hopper/seesaw_host.py", "_SPECS"): "compiled code per call signature (shapes, strides, dtypes, "
                                                "flags), never keyed by an address",
    ("kernel/plan_reference.py", "_UNIFORM"): "the immutable host plans of uniform batches per shape, never "
                                              "evicted (a captured graph reads them), never keyed by an address",
}
DECODE_PATH = ["kernel", "model", "integrations", "dispatch", "compat.py"]
MUTABLE_CALLS = {"dict", "list", "set", "OrderedDict", "defaultdict", "WeakKeyDictionary", "WeakValueDictionary"}


def _decode_modules():
    for part in DECODE_PATH:
        path = SRC / part
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def _mutable(node) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) in MUTABLE_CALLS
    return False


def test_no_module_level_mutable_state_on_the_decode_path():
    """The decode path's modules bind no mutable container at module level (constants are
    tuples, frozensets or read-only mappings), declare no ``global``, and cache no function
    on a pointer: what a call does depends on its arguments and the objects passed in."""
    found = []
    for path in _decode_modules():
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _mutable(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    name = getattr(t, "id", ast.unparse(t))
                    if name != "__all__" and (rel, name) not in ALLOWED:
                        found.append(f"{rel}:{node.lineno} {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{rel}:{node.lineno} global {', '.join(node.names)}")
    assert not found, "module-level mutable state on the decode path:\n" + "\n".join(found)


def test_no_module_reaches_into_anothers_private_names():
    """No module of the decode path imports another module's private name (``from x import
    _name``; the package-private modules ``_common``, ``_gluon``, ``_launch`` ... are imported
    whole or for their public names)."""
    import importlib

    found = []
    for path in _decode_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mla_var3"):
                for alias in node.names:
                    if not alias.name.startswith("_") or alias.name.startswith("__"):
                        continue
                    try:                       # a private *module* of a package is the package's own
                        importlib.import_module(f"{node.module}.{alias.name}")
                        continue
                    except ImportError:
                        found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.module}.{alias.name}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_an_entry_signature_holds_every_fact_the_checks_read(monkeypatch):
    """The fast path skips an entry's checks for a call whose signature an earlier call passed
    them with: any change of a tensor's shape, strides, dtype or 16-byte alignment, of the
    lengths' layout or of the flags gives another signature; a call needing a gradient, lengths
    not int32 and contiguous, value checks on, or a non-bool ``causal`` give none (the checked path)."""
    from mla_var3.kernel.decode import entry_signature

    monkeypatch.delenv("MLA_VAR3_CHECK", raising=False)
    q = torch.zeros(2, 1, 4, 576, dtype=torch.bfloat16)
    cache = torch.zeros(6, 64, 1, 576, dtype=torch.bfloat16)
    table = torch.zeros(2, 3, dtype=torch.int32)
    lens = torch.full((2,), 64, dtype=torch.int32)
    sig = lambda q=q, cache=cache, table=table, lens=lens, causal=True, dv=512: entry_signature(  # noqa: E731
        "compat", "auto", causal, (q, cache, table), lens, dv)
    base = sig()
    assert base is not None and base == sig(q=q.clone(), cache=cache.clone(), lens=lens.clone())
    flat = torch.zeros(2 * 576 + 8, dtype=torch.bfloat16)
    variants = [sig(q=q[:1]), sig(q=q.half()), sig(q=flat[8:].view(2, 1, 1, 576).expand(2, 1, 4, 576)),
                sig(cache=cache[:5]), sig(table=table[:, :2]), sig(table=table.t().contiguous().t()),
                sig(causal=False), sig(dv=256), sig(lens=None)]
    assert len({base, *variants}) == len(variants) + 1
    assert sig(causal=1) is None
    assert sig(lens=lens.long()) is None and sig(lens=torch.zeros(4, dtype=torch.int32)[::2]) is None
    with torch.enable_grad():
        assert sig(q=q.float().requires_grad_().bfloat16()) is None
    monkeypatch.setenv("MLA_VAR3_CHECK", "1")
    assert sig() is None
