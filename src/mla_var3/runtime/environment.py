"""What a measurement ran on: device, clocks as found, library versions, project commit.

Every result record carries :func:`environment`'s dict, so a number can always be traced to
the GPU, the software and the code that produced it.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path

#: nvidia-smi fields recorded as found (clocks are never changed by this package).
_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
               "power.limit", "temperature.gpu", "persistence_mode")


def device_name() -> str:
    """The CUDA device's name (e.g. ``"NVIDIA H200"``), or ``"cpu"`` without CUDA."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def device_slug(name: str | None = None) -> str:
    """A short folder-safe name for a device: ``"NVIDIA H200"`` -> ``"h200"``, ``"cpu"``."""
    name = device_name() if name is None else name
    slug = name.lower()
    for prefix in ("nvidia ", "amd ", "instinct "):
        slug = slug.replace(prefix, "")
    out = "".join(c if c.isalnum() else "-" for c in slug).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    return out or "unknown"


def nvidia_smi(index: int = 0) -> dict[str, str]:
    """Clocks and settings of GPU ``index`` as ``nvidia-smi`` reports them; {} when absent."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run(
            [exe, f"--id={index}", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.splitlines()[0].split(",")] if out else []
    return dict(zip(_SMI_FIELDS, values)) if len(values) == len(_SMI_FIELDS) else {}


@functools.cache
def git_commit() -> dict[str, object]:
    """The project's git commit (``"unknown"`` outside a checkout) and whether the tree is dirty.

    ``MLA_VAR3_COMMIT`` overrides it, for copies of the tree that carry no git history (a
    benchmark machine that received the files only).
    """
    if os.environ.get("MLA_VAR3_COMMIT"):
        return {"commit": os.environ["MLA_VAR3_COMMIT"], "dirty": None}
    root = Path(__file__).resolve().parents[3]
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return {"commit": "unknown", "dirty": None}
    try:
        commit = subprocess.run([git, "-C", str(root), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        status = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": commit or "unknown", "dirty": bool(status.strip()) if commit else None}


def environment() -> dict[str, object]:
    """Metadata recorded with every measurement.

    Keys: ``device`` (name), ``gpu`` (bool), ``capability``, ``sm_count``, ``memory_gb``,
    ``l2_bytes``, ``clocks`` (nvidia-smi fields as found, {} when absent), ``torch``, ``triton``,
    ``cuda``, ``python``, ``platform``, ``commit``, ``dirty``, ``timestamp`` (UTC ISO 8601),
    ``interpreter`` (TRITON_INTERPRET set).
    """
    import os

    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    info: dict[str, object] = {
        "device": device_name(),
        "gpu": torch.cuda.is_available(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "interpreter": os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **git_commit(),
    }
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        info.update(
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_gb=round(props.total_memory / 1e9, 1),
            l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0),
            clocks=nvidia_smi(idx),
        )
    else:
        info.update(capability=None, sm_count=None, memory_gb=None, l2_bytes=None, clocks={})
    return info
