"""The Hopper Gluon kernel compiles for sm_90 without a GPU: HGMMA in the SASS, no spills,
shared memory within one CTA's 227 KiB, and the score MMA split between the warpgroups.

Gluon does not run under the Triton interpreter, so the numerics are checked on a Hopper GPU
(``benchmarks/serving_check.py`` and the GPU tests); this test guards what the compiler decides. The
compile runs in a subprocess with ``TRITON_INTERPRET=0`` (the variable changes what the jit
decorators return at import). Five variants (~2 s each) cover every constexpr branch that
changes code: causal / non-causal, split-KV (fp32 partial output) and seqlens (with the tail
zeroing), bf16 / fp16, the sequential and the pipelined schedule.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

gluon_mod = pytest.importorskip("mla_var3.kernel.hopper.absorbed_gluon")

if not gluon_mod.GLUON_AVAILABLE:
    pytest.skip(f"triton.experimental.gluon unavailable: {gluon_mod.GLUON_IMPORT_ERROR}", allow_module_level=True)

import triton  # noqa: E402

from mla_var3.kernel._common import SMEM_LIMIT  # noqa: E402
from mla_var3.kernel.sass import (compile_gluon_builds, compile_gluon_in_subprocess,  # noqa: E402
                                  mma_loops)

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_CUOBJDUMP = _BIN / "cuobjdump"

VARIANTS = [
    dict(dtype="bf16", causal=True, split=False, has_seqlens=False, pipeline=False),
    dict(dtype="bf16", causal=True, split=True, has_seqlens=True, pipeline=False),
    dict(dtype="fp16", causal=False, split=False, has_seqlens=False, pipeline=False),
    dict(dtype="bf16", causal=True, split=False, has_seqlens=False, pipeline=True),
    dict(dtype="bf16", causal=True, split=True, has_seqlens=True, pipeline=True),
]

@pytest.fixture(scope="module")
def compiled():
    if not _CUOBJDUMP.exists():
        pytest.skip(f"cuobjdump not shipped with this triton ({_CUOBJDUMP})")
    builds = compile_gluon_builds("mla_var3.kernel.hopper.absorbed_gluon", [dict(k=512, p=64, **v) for v in VARIANTS],
                                  timeout=300)
    return [dict(variant=v, build=b) for v, b in zip(VARIANTS, builds)]


@pytest.mark.parametrize("idx", range(len(VARIANTS)), ids=[
    "-".join(f"{k}={v}" for k, v in variant.items()) for variant in VARIANTS])
def test_compiles_with_hgmma_and_no_spills(compiled, idx):
    variant, build = compiled[idx]["variant"], compiled[idx]["build"]
    assert build.num_warps == gluon_mod.NUM_WARPS
    # tensor-core MMA: scores 64 x 32 per warpgroup over K + P = 576 (36 x k16), output 64 x 256 per
    # warpgroup over 64 keys (4 x k16). A 64x64 score MMA would mean both warpgroups compute all of S.
    # The pipelined schedule has the score MMA twice in the code: block 0 before the loop, block
    # j + 1 inside it.
    score_copies = 2 if variant["pipeline"] else 1
    assert build.hgmma == {"64x32x16": score_copies * (512 + 64) // 16, "64x256x16": 64 // 16}, build.hgmma
    # no spills: no local memory, no stack, no local loads/stores in the SASS
    assert build.stack_bytes == 0, build.stack_bytes
    assert not re.search(r"\b(STL|LDL)\b", build.sass), "register spills (STL/LDL) in the SASS"
    assert 0 < build.registers <= 255
    assert 0 < build.shared_bytes <= SMEM_LIMIT, build.shared_bytes


def test_num_splits_fill_one_wave():
    choose = gluon_mod.choose_num_splits
    assert choose(64, 128, 4096, sms=132) == 1            # 128 programs: more than half a wave
    assert choose(16, 512, 4096, sms=132) == 1
    assert choose(32, 128, 4096, sms=132) == 2            # 64 programs -> 128 (measured faster than 256)
    assert choose(16, 128, 4096, sms=132) == 4            # 32 programs -> 128
    assert choose(1, 128, 4096, sms=132) == 16            # capped by >= 4 key blocks per range
    assert choose(1, 128, 32768, sms=132) == 64           # capped by max_splits
    assert choose(32, 128, 4096, sms=132, waves=2) == 4
    for b, rows, t in [(3, 100, 700), (16, 512, 4096), (1, 16, 65)]:
        ns = choose(b, rows, t, sms=132)
        assert ns >= 1 and (ns == 1 or b * -(-rows // 64) * ns <= 132)


def test_launcher_rejects_cpu_and_bad_shapes():
    qc = torch.zeros(1, 2, 1, 512, dtype=torch.bfloat16)
    qpe = torch.zeros(1, 2, 1, 64, dtype=torch.bfloat16)
    z = torch.zeros(1, 8, 512, dtype=torch.bfloat16)
    kpe = torch.zeros(1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        gluon_mod.flash_mla_gluon(qc, qpe, z, kpe, scale=0.1)
    with pytest.raises(ValueError, match="qc must be"):
        gluon_mod.flash_mla_gluon(qc[0], qpe, z, kpe, scale=0.1)


SEESAW_VARIANTS = [dict(dtype="bf16", causal=True), dict(dtype="fp16", causal=False, has_seqlens=True, head_major=False),
                   dict(dtype="bf16", causal=True, paged=True), dict(dtype="bf16", causal=True, paged=True,
                                                                     head_major=False, persistent=True),
                   # a plan whose kind the GPU chose: both kernels, each gated on the choice
                   dict(dtype="bf16", causal=True, paged=True, head_major=False, gated=True),
                   dict(dtype="bf16", causal=True, paged=True, head_major=False, persistent=True, gated=True)]
#: measured with triton 3.6: the default partition (WG0) keeps ~20 scalars (TMA addresses) on
#: the stack: 64-96 B dense, 152 B paged with the worker at 240 registers (120 B at 232; the
#: page list lives in shared memory; reading the block table in the loop took 168-248 B); a
#: larger frame means the register budget changed. The packed kernel (a loop over items and a
#: loader warp) spills 256 B, outside the pair loops.
SEESAW_STACK_LIMIT = {False: 160, True: 320}
#: spilled values reloaded per pair in each warpgroup's pair loop (item kernel, packed kernel):
#: the item kernel, with WG0's own key views built per pair, 3-7 (5-20 paged with all views
#: hoisted, which measured 0.7-2.7 % slower); the packed kernel, with all its views built per
#: pair, 0 in WG0 and 6 in WG1 (11 and 7 with hoisted views; its first build reloaded 50 and ran
#: 0.55-0.65x)
PAIR_LOOP_RELOADS = {False: 10, True: 10}
#: warpgroup barriers (BAR.SYNC) per pair in each pair loop: measured 7 and 9 with the six load
#: barriers as separate allocations (11 and 11 as one [6, 1] allocation, whose slices the
#: compiler's hazard analysis cannot tell apart, so it fenced every TMA op from the one before)
PAIR_LOOP_BARRIERS = 9


def _pair_loops(sass: str) -> list[str]:
    """The bodies of the innermost loops that hold one pair's MMAs of a warpgroup (44 HGMMA:
    36 for its scores, 8 for its two P.Z products), one instruction per line."""
    return ["\n".join(t for _, t in body) for body in mma_loops(sass, 44)[:2]]


def _compile_seesaw(variant: dict):
    """Compile one seesaw variant for sm_90 in a child process (a ``GluonBuild``: shared and
    stack bytes, HGMMA shapes, PTX and SASS)."""
    if not _CUOBJDUMP.exists():
        pytest.skip(f"cuobjdump not shipped with this triton ({_CUOBJDUMP})")
    return compile_gluon_in_subprocess("mla_var3.kernel.hopper.absorbed_seesaw", timeout=300, k=512, p=64, **variant)


@pytest.mark.parametrize("idx", range(len(SEESAW_VARIANTS)),
                         ids=["-".join(f"{k}={v}" for k, v in v.items()) for v in SEESAW_VARIANTS])
def test_seesaw_compiles_warp_specialised(idx):
    build = _compile_seesaw(SEESAW_VARIANTS[idx])
    ptx, sass, counts = build.ptx, build.sass, build.hgmma
    # each warpgroup: full 64 x 64 score tiles over K + P = 576 (36 x k16) and two 64 x 256 P.Z
    # products over 64 keys (2 x 4 x k16): the seesaw's split of the work, in two partitions
    assert counts == {"64x64x16": 2 * (512 + 64) // 16, "64x256x16": 2 * 2 * 64 // 16}, counts
    # warp specialisation: the worker gives registers back, the default partition takes them
    assert "setmaxnreg.dec" in ptx and "setmaxnreg.inc" in ptx
    # every program lets the combine (a programmatic dependent launch) start early, once
    assert ptx.count("griddepcontrol.launch_dependents") == 1 and "PREEXIT" in sass
    # only the gated packed kernel (launched after the gated item kernel) waits for the grid
    # before it, and only where it exits without work
    gated, persistent = (SEESAW_VARIANTS[idx].get(x, False) for x in ("gated", "persistent"))
    assert ptx.count("griddepcontrol.wait") == int(gated and persistent)
    assert build.stack_bytes <= SEESAW_STACK_LIMIT[persistent], f"spills: {build.stack_bytes} B per thread"
    loops = _pair_loops(sass)
    assert len(loops) == 2, "expected one pair loop per warpgroup"
    reloads = [loop.count("LDL") for loop in loops]
    assert max(reloads) <= PAIR_LOOP_RELOADS[persistent], f"spilled values reloaded per pair: {reloads}"
    barriers = [loop.count("BAR.SYNC") for loop in loops]
    assert max(barriers) <= PAIR_LOOP_BARRIERS, f"warpgroup barriers per pair: {barriers}"
    assert 0 < build.shared_bytes <= SMEM_LIMIT, build.shared_bytes


def test_seesaw_applies_only_where_checked_on_a_gpu():
    from mla_var3.kernel.hopper.seesaw_host import seesaw_applies

    def dense(b=2, h=4, s=3, k=512, p=64, t=100, dtype=torch.bfloat16):
        return (torch.zeros(b, h, s, k, dtype=dtype), torch.zeros(b, h, s, p, dtype=dtype),
                (torch.zeros(b, t, k, dtype=dtype), torch.zeros(b, t, p, dtype=dtype)))

    assert seesaw_applies(*dense())
    assert not seesaw_applies(*dense(k=256))                        # compiles, never run on a GPU
    assert not seesaw_applies(*dense(p=32))                         # p is stored over the 64-wide RoPE piece
    assert not seesaw_applies(*dense(dtype=torch.float32))
    qc, qpe, keys = dense()
    assert not seesaw_applies(qc[:, :, ::2], qpe[:, :, ::2], keys)  # rows not evenly strided
    assert not seesaw_applies(qc, qpe.transpose(1, 2).contiguous().transpose(1, 2), keys)  # row orders differ
    z_odd = torch.zeros(2, 100, 520, dtype=torch.bfloat16)[..., 4:516]  # base not 16-byte aligned: no TMA
    assert not seesaw_applies(qc, qpe, (z_odd, keys[1]))
    z_col = torch.zeros(2, 512, 100, dtype=torch.bfloat16).transpose(1, 2)  # no unit last stride
    assert not seesaw_applies(qc, qpe, (z_col, keys[1]))
    # FlashMLA's layout: q [b, s, h, 576] seen as [b, h, s, .] rows token * h + head; 64-token pages
    q = torch.zeros(2, 3, 4, 576, dtype=torch.bfloat16).transpose(1, 2)
    cache = torch.zeros(10, 64, 1, 576, dtype=torch.bfloat16)
    assert seesaw_applies(q[..., :512], q[..., 512:], (cache, None), paged=True)
    assert not seesaw_applies(q[..., :512], q[..., 512:], (torch.zeros(10, 32, 1, 576, dtype=torch.bfloat16), None),
                              paged=True)


def test_split_plan_and_finish_on_the_host():
    """The launchers' shared host side: split ranges without an empty one, partial buffers when
    split and views of the outputs when not, and the merge of the partials (run here by the
    portable combine kernel, under the interpreter without a GPU) against a float64 log-sum-exp
    merge."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b, h, s, k, t = 2, 4, 3, 64, 777                      # 13 key blocks
    o_latent = torch.full((b, h, s, k), float("nan"), dtype=torch.float32, device=dev)
    lse = torch.full((b, h, s), float("nan"), dtype=torch.float32, device=dev)
    ns, per, o_buf, lse_buf = gluon_mod._split_plan(o_latent, lse, t, 5)
    assert (ns, per) == (5, 3) and o_buf.shape == (b, h * s, 5, k) and lse_buf.shape == (b, h * s, 5)
    assert gluon_mod._split_plan(o_latent, lse, t, 100)[:2] == (13, 1)       # at most one range per block
    ns1, _, o1, l1 = gluon_mod._split_plan(o_latent, lse, t, 1)
    assert ns1 == 1 and o1.data_ptr() == o_latent.data_ptr() and l1.data_ptr() == lse.data_ptr()

    g = torch.Generator().manual_seed(0)
    o_buf.copy_(torch.randn(o_buf.shape, generator=g))       # copy_ moves CPU draws to the device
    lse_buf.copy_(torch.randn(lse_buf.shape, generator=g) * 3)
    gluon_mod._finish(o_buf, lse_buf, o_latent, lse)
    w = torch.softmax(lse_buf.double(), dim=-1)
    ref_o = (w[..., None] * o_buf.double()).sum(dim=2).view(b, h, s, k)
    ref_lse = torch.logsumexp(lse_buf.double(), dim=-1).view(b, h, s)
    assert torch.allclose(o_latent.double(), ref_o, atol=1e-5) and torch.allclose(lse.double(), ref_lse, atol=1e-5)


@pytest.mark.parametrize("key_box", [512, 256])
def test_operand_descriptors_view_queries_head_major(key_box):
    qc = torch.zeros(2, 4, 3, 512, dtype=torch.bfloat16)
    qpe = torch.zeros(2, 4, 3, 64, dtype=torch.bfloat16)
    z, kpe = torch.zeros(2, 100, 512, dtype=torch.bfloat16), torch.zeros(2, 100, 64, dtype=torch.bfloat16)
    descs = gluon_mod._operand_descriptors(qc, qpe, z, kpe, key_box)
    assert [(list(d.shape), list(d.block_shape)) for d in descs] == [
        ([2, 12, 512], [1, 64, key_box]), ([2, 12, 64], [1, 64, 64]),
        ([2, 100, 512], [1, 64, key_box]), ([2, 100, 64], [1, 64, 64])]


_COMBINE_SCRIPT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mla_var3.kernel.combine import _combine_planned_kernel, _tiles
sig = {"o_part_ptr": "*fp32", "lse_part_ptr": "*fp32", "seqs_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32"}
sig.update({n: "i32" for n in ("ROWS", "S", "H", "V", "stride_ob", "stride_oh", "stride_os", "stride_ov",
                               "stride_lb", "stride_lh", "stride_ls")})
block_r, block_v, chunk = _tiles(1, 128, 512)                  # b = 1: the launcher's tiles on a GPU
const = dict(HEAD_MAJOR=True, BLOCK_R=block_r, BLOCK_V=block_v, PDL=True, CHUNK=chunk)
sig.update({n: "constexpr" for n in const})
c = triton.compile(ASTSource(fn=_combine_planned_kernel, signature=sig, constexprs=const),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "launch_pdl": True})
print(json.dumps(dict(ptx=c.asm["ptx"], pdl=c.metadata.launch_pdl)))
"""


_PLANNER_SCRIPT = r"""
import json
from mla_var3.kernel import plan_kernels as dp
from mla_var3.kernel.sass import compile_report
out = {}
for name, fn, consts in (("cut_sim", dp._cut_sim_kernel, dp.cut_sim_constexprs(True, 66)),
                         ("cut_sim_s4", dp._cut_sim_kernel, dp.cut_sim_constexprs(True, 16)),
                         ("plan", dp._plan_kernel, dp.plan_constexprs(True, 256, True)),
                         ("plan_b32", dp._plan_kernel, dp.plan_constexprs(True, 256, True, 32)),
                         ("packed", dp._packed_kernel, dp.packed_constexprs(True, 256, True, 66)),
                         ("packed_b64", dp._packed_kernel, dp.packed_constexprs(True, 256, True, 66, 64)),
                         ("packed_b32", dp._packed_kernel, dp.packed_constexprs(True, 256, True, 66, 32))):
    sig = {n: "constexpr" if n in consts else ("*i64" if n in ("est_ptr", "cest_ptr") else "*i32")
           if n.endswith("_ptr") else "i32" for n in fn.arg_names}
    rep = compile_report(fn, sig, consts, num_warps=1 if name.startswith("cut_sim") else 4)
    out[name] = [rep.registers, rep.spill_stores]
print(json.dumps(out))
"""


def test_the_decode_planners_compile_for_sm90(tmp_path):
    """The interpreter runs the planners' tests on the CPU but does not type-check them as the
    compiler does (a loop-carried scalar re-bound to a tensor passes there and fails to
    compile): the planners (the cuts' simulation, the item and the packed planner) compile for sm_90 with the constants the GPU launch uses, a pass of
    256 sequences, 64 and 32 (``seq_block``). The packed planner's program starts are computed
    32 programs at a time: a [256 programs x 64 sequences] tile spilled 1,076 bytes per thread."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", _PLANNER_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"compile for sm_90 failed:\n{proc.stderr[-4000:]}"
    sizes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(sizes) == {"cut_sim", "cut_sim_s4", "plan", "plan_b32", "packed", "packed_b64", "packed_b32"}
    assert all(0 < regs <= 255 for regs, _ in sizes.values())
    assert sizes["packed_b64"][1] == sizes["packed_b32"][1] == 0, sizes
    # the cuts' simulation (one warp, its slots and a tile of remainders in registers: 62-69
    # registers) and the item planner (no candidates since the simulation: 40-44) do not spill
    assert sizes["cut_sim"][1] == sizes["cut_sim_s4"][1] == sizes["plan"][1] == sizes["plan_b32"][1] == 0, sizes
    assert sizes["packed"][1] <= 32, sizes
    assert sizes["plan_b32"][0] <= 128, sizes


def test_planned_combine_is_a_dependent_launch_that_waits_first(tmp_path):
    """The split-KV combine after the seesaw kernel is compiled for a programmatic dependent
    launch, and its programs wait (``griddepcontrol.wait``) before they read any partial: its
    launch overlaps the seesaw kernel's last programs, never its writes. Before the wait a
    program reads only its sequence's ``(first_slot, n_items)`` (the planner's, written before
    the seesaw kernel began), to exit at once when there is nothing to merge."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", _COMBINE_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"compile for sm_90 failed:\n{proc.stderr[-4000:]}"
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["pdl"] is True
    assert "griddepcontrol.wait" in r["ptx"], "the combine does not wait for the kernel before it"
    before = r["ptx"][: r["ptx"].index("griddepcontrol.wait")]
    loads = re.findall(r"ld\.global[.\w]*\s+[^;]*", before)
    # the two int32 of seqs[b] (one load each, or one pair), nothing wider and nothing else
    assert 1 <= len(loads) <= 2 and all(".b32" in x or ".v2.b32" in x for x in loads), loads
    assert r["ptx"].count("griddepcontrol.wait") == 1


def test_tma_operand_copies_views_whose_strides_tma_cannot_take():
    """TMA needs 16-byte multiples for every stride but the last. torch calls a [1, 1, 16] view
    with strides (34, 17, 1) contiguous (size-1 dims), so the operand helper checks the strides
    themselves: such a view (NaN-padded test inputs at t = 1) is copied row-major, values kept;
    an aligned contiguous tensor is passed through, a transposed one copied."""
    from mla_var3.kernel.hopper._gluon import tma_operand
    from mla_var3.testing import nan_padded

    x = torch.randn(1, 1, 16).to(torch.bfloat16)
    view = nan_padded(x)
    assert view.is_contiguous() and view.stride() == (34, 17, 1)
    got = tma_operand(view)
    assert got.stride() == (16, 16, 1) and torch.equal(got, x) and got.data_ptr() % 16 == 0
    aligned = torch.randn(2, 8, 64).to(torch.bfloat16)
    assert tma_operand(aligned).data_ptr() == aligned.data_ptr()
    transposed = torch.randn(2, 64, 8).to(torch.bfloat16).transpose(1, 2)
    assert tma_operand(transposed).stride() == (512, 64, 1) and torch.equal(tma_operand(transposed), transposed)
