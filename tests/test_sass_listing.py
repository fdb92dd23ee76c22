"""Reading a cuobjdump ``-sass`` listing (:mod:`mla_var3.kernel.sass`): kernels, instructions,
the MMA loops and what a pass through one may skip, on a hand-written listing in cuobjdump's
format (no compiler needed)."""

from __future__ import annotations

from mla_var3.kernel import sass

LISTING = """
        Function : kernel_a
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0030*/              @!P1 BRA P2, 0x60 ;
        /*0040*/                   FSEL R2, R2, -INF , P3 ;
        /*0050*/                   FSEL R3, R3, -INF , P3 ;
        /*0060*/                   FMUL.FTZ R4, R4, R5 ;
        /*0070*/               @P0 BRA 0x10 ;
        /*0080*/                   EXIT ;
        Function : kernel_b
        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0, 0x80 ;
        /*0020*/                   BRA 0x0 ;
"""


def test_functions_split_the_listing_by_kernel():
    kernels = sass.functions(LISTING)
    assert list(kernels) == ["kernel_a", "kernel_b"]
    assert [t for _, t in sass.instructions(kernels["kernel_b"])] == [
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", "BAR.SYNC.DEFER_BLOCKING 0x0, 0x80", "BRA 0x0"]


def test_opcode_drops_the_predicate_and_keeps_the_modifiers():
    assert sass.opcode("@!P1 BRA P2, 0x60") == "BRA"
    assert sass.opcode("@UP0 UIADD3 UR9, UR4, 0x37548, URZ") == "UIADD3"
    assert sass.opcode("FMUL.FTZ R4, R4, R5") == "FMUL.FTZ"
    assert sass.opcode("") == ""


def test_mma_loops_and_what_a_pass_may_skip():
    a = sass.functions(LISTING)["kernel_a"]
    (loop,) = sass.mma_loops(a, 2)                  # 0x10 .. the backward branch at 0x70
    assert [addr for addr, _ in loop] == [0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70]
    assert sass.mma_loops(a, 1) == [] and sass.mma_loops(a, 3) == []
    # the predicated branch with a predicate operand jumps over the two FSEL
    assert sass.forward_branches(loop) == [(2, 2)]
    prof = sass.loop_profile(loop)
    assert prof["instructions"] == 7
    assert prof["opcodes"] == {"BRA": 2, "FSEL": 2, "HGMMA.64x64x16.F32.BF16": 2, "FMUL.FTZ": 1}
    # shortest first across loops of one kernel; a loop with no forward branch skips nothing
    (b_loop,) = sass.mma_loops(sass.functions(LISTING)["kernel_b"], 1)
    assert len(b_loop) == 3 and sass.forward_branches(b_loop) == []
