"""The seesaw kernel's pair loops in SASS, compiled for sm_90 on the CPU, beside official FlashMLA's.

No GPU: each build of ``mla_var3.kernel.hopper.absorbed_seesaw`` is compiled in a child process
(``mla_var3.kernel.sass.compile_gluon_in_subprocess``) and its two pair loops (44 HGMMA each,
one per warpgroup) are read from the cuobjdump listing; with ``--flash-mla DIR`` the same is
done for FlashMLA's decode kernel in the prebuilt package's shared library (the kernel whose
name holds ``splitkv_mla``; only instruction counts are kept). Per loop: its length, the forward
branches inside it (code one pass may skip: the masked block's path, retries) and the counts
of the opcodes that tell the schedules apart — warpgroup barriers (``BAR.SYNC``), reloads of
spilled values (``LDL``), register -> uniform-register moves (``R2UR``), uniform-datapath work
(``UMOV``, ``UIADD3``), the softmax's FP32 work. A table last; every opcode count in the JSON.

    python benchmarks/sass_loops.py --out sass-loops.json [--flash-mla DIR]
"""

from __future__ import annotations

import glob
import os
import sys

from common import baseline_parser, environment, write_json

from mla_var3.kernel import sass

#: the builds compared: the item kernel on FlashMLA's paged cache (the compat call), the item
#: kernel on a dense head-major cache (``flash_mla``), the packed kernel (a packed plan)
BUILDS = {
    "item paged": dict(dtype="bf16", causal=True, paged=True, has_seqlens=True, head_major=False),
    "item dense": dict(dtype="bf16", causal=True),
    "packed paged": dict(dtype="bf16", causal=True, paged=True, has_seqlens=True, head_major=False,
                         persistent=True),
}
#: the columns of the table (substrings of an opcode)
CLASSES = ["HGMMA", "BAR.SYNC", "BAR.ARV", "LDL", "R2UR", "UMOV", "UIADD3", "FMUL", "FFMA", "FSEL", "MUFU",
           "SYNCS", "UTMALDG"]


def summary(body) -> dict:
    """A loop's profile (:func:`mla_var3.kernel.sass.loop_profile`) plus the class counts."""
    prof = sass.loop_profile(body)
    prof["classes"] = {c: sum(n for op, n in prof["opcodes"].items() if op.startswith(c)) for c in CLASSES}
    prof["longest_skip"] = max((n for _, n in prof["forward_branches"]), default=0)
    return prof


def flash_mla_loops(folder: str) -> list[dict]:
    """FlashMLA's two pair loops from the package's shared library in ``folder``."""
    libs = glob.glob(os.path.join(folder, "flash_mla", "*.so"))
    if not libs:
        raise FileNotFoundError(f"no flash_mla/*.so under {folder}")
    listing = sass.disassemble(libs[0])
    kernels = [body for name, body in sass.functions(listing).items() if "splitkv_mla" in name]
    if len(kernels) != 1:
        raise RuntimeError(f"expected one splitkv_mla kernel in {libs[0]}, found {len(kernels)}")
    return [summary(b) for b in sass.mma_loops(kernels[0], 44)[:2]]


def main() -> None:
    ap = baseline_parser(__doc__)
    args = ap.parse_args()
    loops: dict[str, list[dict]] = {}
    for name, options in BUILDS.items():
        print(f"compiling {name} {options} ...", file=sys.stderr, flush=True)
        build = sass.compile_gluon_in_subprocess("mla_var3.kernel.hopper.absorbed_seesaw", **options)
        bodies = sass.mma_loops(build.sass, 44)[:2]
        if len(bodies) != 2:
            raise RuntimeError(f"{name}: expected two pair loops, found {len(bodies)}")
        loops[name] = [summary(b) for b in bodies]
        for p in loops[name]:
            p["stack_bytes"] = build.stack_bytes
    if args.flash_mla:
        loops["FlashMLA"] = flash_mla_loops(args.flash_mla)
    write_json(args.out, {"env": environment(), "builds": BUILDS, "loops": loops})
    print("\n| build | loop | instructions | longest skip | " + " | ".join(CLASSES) + " |")
    print("|---|---|---|---|" + "---|" * len(CLASSES))
    for name, profs in loops.items():
        for i, p in enumerate(profs):
            cells = " | ".join(str(p["classes"][c]) for c in CLASSES)
            print(f"| {name} | {i} | {p['instructions']} | {p['longest_skip']} | {cells} |")


if __name__ == "__main__":
    main()
