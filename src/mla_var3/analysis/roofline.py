"""Roofline prediction: time = max(FLOPs / peak, bytes / bandwidth), and which bound applies.

:func:`predict` is the "plan_empty" prediction: the time a design would take at the device's
ceilings, from the cost model alone, without tensors or a GPU.

Example
-------
>>> from mla_var3.shapes import get_preset, Problem
>>> from mla_var3.analysis.roofline import predict
>>> pr = predict("flash_mla", get_preset("deepseek-v3"), Problem(b=32, s=1, t=4096), "h200")
>>> pr.bound, pr.ceilings.kind, round(pr.time_s * 1e6, 1)
('compute', 'measured', 51.4)
"""

from __future__ import annotations

from dataclasses import dataclass

from mla_var3.analysis.cost import Cost, cost as _cost, design_pipeline
from mla_var3.analysis.devices import Ceilings, Device, get_device
from mla_var3.shapes import MLADims, Problem


@dataclass(frozen=True)
class Prediction:
    """A roofline prediction for one design on one device.

    Attributes
    ----------
    design : str
    cost : Cost
    compute_s, memory_s : float
        FLOPs / peak and bytes / bandwidth.
    device : str
        Device key.
    ceilings : Ceilings
        The ceilings used (``ceilings.kind`` says measured or datasheet).
    """

    design: str
    cost: Cost
    compute_s: float
    memory_s: float
    device: str
    ceilings: Ceilings

    @property
    def time_s(self) -> float:
        """Predicted time: the larger of compute and memory time."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """'compute' or 'memory' (compute on a tie)."""
        return bound_of(self.compute_s, self.memory_s)

    def to_dict(self) -> dict:
        """Exact numbers for JSON output."""
        return {
            "design": self.design,
            "device": self.device,
            "ceilings": self.ceilings.kind,
            "flops": self.cost.flops,
            "bytes": self.cost.bytes,
            "intensity": self.cost.intensity,
            "time_s": self.time_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "bound": self.bound,
            "peak_flops_per_s": self.ceilings.flops_per_s,
            "bandwidth_bytes_per_s": self.ceilings.bytes_per_s,
            "ridge": self.ceilings.ridge,
        }


def bound_of(compute_s: float, memory_s: float) -> str:
    """'compute' when compute time >= memory time, else 'memory'."""
    return "compute" if compute_s >= memory_s else "memory"


def roofline_time(c: Cost, ceilings: Ceilings) -> tuple[float, str]:
    """(time in s, bound) of a cost at the given ceilings."""
    compute_s, memory_s = c.flops / ceilings.flops_per_s, c.bytes / ceilings.bytes_per_s
    return max(compute_s, memory_s), bound_of(compute_s, memory_s)


def resolve_ceilings(device: str | Device, dims: MLADims, ceilings: str = "measured") -> tuple[Device, Ceilings]:
    """The device and the ceilings that apply to ``dims.w`` (see :meth:`Device.ceilings`)."""
    dev = get_device(device)
    return dev, dev.ceilings(ceilings, dims.w)


def predict_cost(design: str, c: Cost, device: str | Device, ceilings: Ceilings) -> Prediction:
    """A :class:`Prediction` for a precomputed cost."""
    key = device.key if isinstance(device, Device) else device
    return Prediction(design, c, c.flops / ceilings.flops_per_s, c.bytes / ceilings.bytes_per_s, key, ceilings)


def predict(
    design: str,
    dims: MLADims,
    problem: Problem,
    device: str | Device = "h200",
    ceilings: str = "measured",
    stages: bool = False,
) -> Prediction:
    """Roofline prediction of ``design`` (a name in ``cost.COST_MODELS``) without tensors.

    ``ceilings`` 'measured' uses the device's measured ceilings when it has them (else the
    datasheet; ``Prediction.ceilings.kind`` records which). ``stages=True`` adds query
    absorption and output decompression to the absorbed designs (see ``design_pipeline``).
    """
    dev, ceil = resolve_ceilings(device, dims, ceilings)
    c = design_pipeline(design, dims, problem) if stages else _cost(design, dims, problem)
    return predict_cost(design, c, dev, ceil)
