"""Compile a ``@triton.jit`` kernel for a GPU architecture (sm_90 by default) on any machine,
GPU or not, and report what the compiler made of it: registers, spills, shared memory, and
whether the SASS uses Hopper's warpgroup MMA (HGMMA).

The Triton interpreter does not catch the layout and shape errors of ``tl.dot`` that fail on a
GPU, nor register pressure; this does, at no device cost. ptxas and cuobjdump ship with the
Triton wheel.

``TRITON_INTERPRET=1`` changes what ``@triton.jit`` returns at import time, so compiling must
happen in a process where it is ``0`` (``mla_var3.kernel`` turns it on when it is unset and there
is no GPU): use :func:`compile_in_subprocess` from tests (which run
under the interpreter on CPU machines), :func:`compile_report` in a clean process.

Example
-------
>>> rep = compile_in_subprocess("mla_var3.kernel.combine", "_combine_kernel",
...     {"o_part_ptr": "*fp32", ..., "BLOCK_R": "constexpr"}, {"BLOCK_R": 16, ...})  # doctest: +SKIP
>>> rep.registers, rep.spill_stores, rep.shared_bytes, rep.hgmma                        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CompileReport:
    """What ptxas and the SASS say about one compiled kernel.

    registers : registers per thread.
    spill_stores, spill_loads : bytes spilled to local memory (0 is the goal).
    stack_bytes : stack frame per thread.
    shared_bytes : dynamic shared memory Triton requests per program (its ``metadata.shared``).
    hgmma : the SASS contains HGMMA (warpgroup MMA; Hopper tensor cores at full rate).
    hgmma_count : number of HGMMA instructions in the SASS.
    num_warps, num_stages, arch : the compile options.
    """

    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int
    hgmma: bool
    hgmma_count: int
    num_warps: int
    num_stages: int
    arch: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads

    def summary(self) -> str:
        return (f"{self.kernel} sm_{self.arch} warps={self.num_warps} stages={self.num_stages}: "
                f"{self.registers} regs, spills {self.spill_stores}/{self.spill_loads} B (st/ld), "
                f"stack {self.stack_bytes} B, smem {self.shared_bytes} B, HGMMA x{self.hgmma_count}")


def _tool(name: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{name} not found at {path}: the Triton wheel ships it for NVIDIA targets")
    return str(path)


def disassemble(cubin) -> str:
    """The SASS listing (cuobjdump ``-sass``) of a cubin or of an ELF holding cubins (a
    compiled extension's shared library) at path ``cubin``."""
    return subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout


def compile_report(fn, signature: dict[str, str], constexprs: dict[str, object], *, num_warps: int = 4,
                   num_stages: int = 2, arch: int = 90, attrs: dict | None = None) -> CompileReport:
    """Compile ``fn`` (a ``@triton.jit`` function; not under the interpreter) for ``sm_<arch>``.

    ``signature`` maps every argument to a Triton type (``"*bf16"``, ``"i32"``, ``"fp32"``,
    ``"constexpr"``); ``constexprs`` gives the constexpr values; ``attrs`` optional argument
    attributes (``{(index,): [["tt.divisibility", 16]]}``), as :func:`launch_signature` builds
    them. Prefer :func:`launch_signature`: a hand-written signature without the launch's
    specialisation (unit strides as constants, 16-divisibility) compiles to slower, scalar
    code with more registers than the real launch. Raises whatever the compiler
    raises when the kernel does not compile (e.g. OutOfResources for shared memory).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not hasattr(fn, "arg_names"):
        raise TypeError("compile_report needs a @triton.jit function compiled without TRITON_INTERPRET")
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    name = compiled.metadata.name
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        cubin = Path(tmp) / "k.cubin"
        ptx.write_text(compiled.asm["ptx"])
        cubin.write_bytes(compiled.asm["cubin"])
        suffix = "a" if arch >= 90 else ""
        ptxas = subprocess.run([_tool("ptxas"), "-v", f"-arch=sm_{arch}{suffix}", str(ptx), "-o", os.devnull],
                               capture_output=True, text=True, check=True)
        sass = disassemble(cubin)
    info = ptxas.stdout + ptxas.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", info)
    hgmma_count = len(re.findall(r"\bHGMMA\b", sass))
    return CompileReport(
        kernel=name,
        registers=int(regs.group(1)) if regs else -1,
        stack_bytes=int(spill.group(1)) if spill else -1,
        spill_stores=int(spill.group(2)) if spill else -1,
        spill_loads=int(spill.group(3)) if spill else -1,
        shared_bytes=int(compiled.metadata.shared),
        hgmma=hgmma_count > 0,
        hgmma_count=hgmma_count,
        num_warps=num_warps,
        num_stages=num_stages,
        arch=arch,
    )


def launch_signature(fn, args: dict[str, object]) -> tuple[dict[str, str], dict[str, object], dict]:
    """The (signature, constexprs, attrs) a launch of ``fn`` with ``args`` would compile.

    ``args`` maps every parameter of ``fn`` to its launch value: a pointer as a type string
    (``"*bf16"``; assumed 16-byte aligned, as torch allocations are), an int, a float, or a
    constexpr value. Mirrors Triton's JIT specialisation: constexpr parameters keep their
    value, an int equal to 1 becomes the constant 1, ints divisible by 16 and pointers carry
    ``tt.divisibility = 16``, ints beyond 32 bits become i64, floats fp32.
    """
    names = list(fn.arg_names)
    missing = [n for n in names if n not in args and not fn.params[names.index(n)].has_default]
    unknown = [n for n in args if n not in names]
    if missing or unknown:
        raise ValueError(f"launch_signature({fn.__name__}): missing {missing}, unknown {unknown}")
    signature: dict[str, str] = {}
    constexprs: dict[str, object] = {}
    attrs: dict = {}
    for i, (name, param) in enumerate(zip(names, fn.params)):
        value = args[name] if name in args else param.default
        divisible = False
        if param.is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, str) and value.startswith("*"):
            signature[name], divisible = value, True
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                signature[name], constexprs[name] = "constexpr", 1
            else:
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
                divisible = value % 16 == 0
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise ValueError(f"launch_signature: cannot type argument {name}={value!r}")
        if divisible:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def compile_launch_in_subprocess(module: str, kernel: str, args: dict[str, object], *, num_warps: int = 4,
                                 num_stages: int = 2, arch: int = 90, timeout: float = 600) -> CompileReport:
    """Compile ``module.kernel`` as a launch with ``args`` would (see :func:`launch_signature`),
    in a fresh process without the interpreter; the way tests check a kernel's GPU path."""
    return _run_child(dict(module=module, kernel=kernel, args=args, num_warps=num_warps, num_stages=num_stages,
                           arch=arch), timeout)


def compile_in_subprocess(module: str, kernel: str, signature: dict[str, str], constexprs: dict[str, object], *,
                          num_warps: int = 4, num_stages: int = 2, arch: int = 90,
                          timeout: float = 600) -> CompileReport:
    """:func:`compile_report` for ``module.kernel`` in a fresh Python process with
    ``TRITON_INTERPRET=0`` (safe to call from interpreter-mode tests). Raises RuntimeError with
    the child's stderr when compilation fails."""
    return _run_child(dict(module=module, kernel=kernel, signature=signature, constexprs=constexprs,
                           num_warps=num_warps, num_stages=num_stages, arch=arch), timeout)


@dataclass(frozen=True)
class GluonBuild:
    """What a Gluon module's ``compile_for_sm90(**options)`` produced.

    shared_bytes : shared memory per program (Triton's ``metadata.shared``).
    stack_bytes : stack frame plus local memory per thread (spills; 0 is the goal).
    hgmma : HGMMA instruction shape (``"64x128x16"``) -> count in the SASS.
    ptx, sass : the PTX (``setmaxnreg`` shows the warp-specialised register split) and SASS.
    registers : registers per thread the cubin declares (the launch's; warp-specialised
        partitions then re-split them with ``setmaxnreg``).
    num_warps : the compile's ``num_warps`` (the default partition's warps).
    """

    shared_bytes: int
    stack_bytes: int
    hgmma: dict
    ptx: str
    sass: str
    registers: int = 0
    num_warps: int = 0


_GLUON_CHILD = r"""
import json, sys
import importlib
module, variants, folder = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
mod = importlib.import_module(module)
res = []
for i, options in enumerate(variants):
    c = mod.compile_for_sm90(**options)
    open(f"{folder}/k{i}.cubin", "wb").write(c.asm["cubin"])
    res.append(dict(shared=c.metadata.shared, num_warps=c.metadata.num_warps, ptx=c.asm["ptx"]))
print(json.dumps(res))
"""


def compile_gluon_builds(module: str, variants: list[dict], *, timeout: float = 600) -> list[GluonBuild]:
    """Run ``module.compile_for_sm90(**options)`` (the Gluon kernels' compile hook) for each
    ``options`` of ``variants`` in one fresh process with ``TRITON_INTERPRET=0``, and read each
    cubin with cuobjdump; the builds in the order of ``variants``. Raises RuntimeError with the
    child's stderr when compilation fails."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    builds = []
    with tempfile.TemporaryDirectory() as tmp:
        env["TRITON_CACHE_DIR"] = str(Path(tmp) / "cache")
        proc = subprocess.run([sys.executable, "-c", _GLUON_CHILD, module, json.dumps(variants), tmp], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {module} {variants} for sm_90 failed:\n{proc.stderr[-4000:]}")
        for i, out in enumerate(json.loads(proc.stdout.strip().splitlines()[-1])):
            cubin = Path(tmp) / f"k{i}.cubin"
            sass = disassemble(cubin)
            usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                                   text=True, check=True).stdout
            mem = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage)}
            shapes = re.findall(r"HGMMA\.(\d+x\d+x\d+)\.", sass)
            builds.append(GluonBuild(out["shared"], mem.get("STACK", 0) + mem.get("LOCAL", 0),
                                     {shape: shapes.count(shape) for shape in set(shapes)}, out["ptx"], sass,
                                     mem.get("REG", 0), out["num_warps"]))
    return builds


def compile_gluon_in_subprocess(module: str, *, timeout: float = 600, **options) -> GluonBuild:
    """:func:`compile_gluon_builds` of one variant: ``module.compile_for_sm90(**options)``."""
    return compile_gluon_builds(module, [options], timeout=timeout)[0]


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:!?U?P\w+, )?(0x[0-9a-f]+)")


def functions(sass: str) -> dict[str, str]:
    """The kernels of a cuobjdump ``-sass`` listing: mangled name -> its own listing."""
    parts = re.split(r"Function : (\S+)", sass)
    return {name: body for name, body in zip(parts[1::2], parts[2::2])}


def instructions(sass: str) -> list[tuple[int, str]]:
    """``(address, text)`` of every instruction of a listing, in order (text without the
    trailing ``;``)."""
    return [(int(a, 16), t.strip()) for a, t in _INSTRUCTION.findall(sass)]


def opcode(text: str) -> str:
    """An instruction's opcode with its modifiers (``FMUL.FTZ``), its predicate dropped."""
    fields = re.sub(r"^@!?U?P\w+\s+", "", text).split()
    return fields[0] if fields else ""


def mma_loops(sass: str, hgmma: int) -> list[list[tuple[int, str]]]:
    """The bodies of the loops (from a backward branch's target to the branch) that hold
    exactly ``hgmma`` HGMMA instructions, shortest first: a pipelined kernel's main loops
    (the seesaw's pair loops hold 44 per warpgroup: 36 for the scores, 8 for two P.Z)."""
    ins = instructions(sass)
    index = {a: i for i, (a, _) in enumerate(ins)}
    bodies = []
    for i, (a, t) in enumerate(ins):
        m = _BRANCH.search(t)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            body = ins[index[int(m.group(1), 16)]: i + 1]
            if sum("HGMMA" in x for _, x in body) == hgmma:
                bodies.append(body)
    return sorted(bodies, key=len)


def forward_branches(body: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """``(position, instructions jumped over)`` of each branch to a later address inside
    ``body``: the code one pass through the loop may skip (a masked block's path, a retry)."""
    where = {a: i for i, (a, _) in enumerate(body)}
    out = []
    for i, (a, t) in enumerate(body):
        m = _BRANCH.search(t)
        if m and int(m.group(1), 16) > a and int(m.group(1), 16) in where:
            out.append((i, where[int(m.group(1), 16)] - i - 1))
    return out


def loop_profile(body: list[tuple[int, str]]) -> dict:
    """A loop body's length, its forward branches and the count of each opcode (with
    modifiers), most frequent first."""
    counts: dict[str, int] = {}
    for _, t in body:
        op = opcode(t)
        counts[op] = counts.get(op, 0) + 1
    return {"instructions": len(body), "forward_branches": forward_branches(body),
            "opcodes": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}


def _run_child(request: dict, timeout: float) -> CompileReport:
    payload = json.dumps(request)
    module, kernel, arch = request["module"], request["kernel"], request["arch"]
    # "0", not unset: importing mla_var3.kernel turns the interpreter on when the variable is
    # absent and there is no GPU.
    env = dict(os.environ, TRITON_INTERPRET="0")
    src_dir = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src_dir + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "mla_var3.kernel.sass"], input=payload, capture_output=True,
                          text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {module}.{kernel} for sm_{arch} failed:\n{proc.stderr[-4000:]}")
    return CompileReport(**json.loads(proc.stdout.strip().splitlines()[-1]))


def _main() -> None:
    import importlib

    args = json.loads(sys.stdin.read())
    fn = getattr(importlib.import_module(args["module"]), args["kernel"])
    if "args" in args:
        signature, constexprs, attrs = launch_signature(fn, args["args"])
    else:
        signature, constexprs, attrs = args["signature"], args["constexprs"], None
    rep = compile_report(fn, signature, constexprs, num_warps=args["num_warps"], num_stages=args["num_stages"],
                         arch=args["arch"], attrs=attrs)
    print(json.dumps(dataclasses.asdict(rep)))


if __name__ == "__main__":
    _main()
