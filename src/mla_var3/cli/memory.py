"""``mla-var3 memory``: KV cache per token (MHA/GQA/MLA/hybrid) and the capacity plan."""

from __future__ import annotations

from mla_var3._argtypes import nonneg_float, nonneg_int, positive_float, positive_int
from mla_var3.analysis.devices import DEFAULT_DEVICE
from mla_var3.cli import _common as C
from mla_var3.shapes import DTYPE_BYTES


def run(args) -> int:
    from mla_var3.analysis.memory import cache_layouts, mla_bytes_per_token, plan_capacity

    dims, dev = C.dims_from_args(args), C.device_from_args(args)
    if args.n > args.context:
        raise ValueError(f"--n {args.n} exceeds --context {args.context}")
    layouts = cache_layouts(dims, context=args.context, n=args.n)
    mem_bytes = args.memory_gb * 1e9 if args.memory_gb else dev.memory_bytes
    reserve = args.reserve_gb * 1e9 if args.reserve_gb is not None else None
    plans = [plan_capacity(dims, mem_bytes, args.tp, args.params, args.weight_dtype, reserve, context=args.context,
                           layout=layout) for layout in ("mla", "expanded")]
    if args.json:
        C.print_json({
            "model": dims.name, "device": dev.key, "context": args.context, "layers": dims.layers,
            "layouts": [{"layout": x.layout, "bytes_per_token_layer": x.bytes_per_token_layer, "formula": x.formula,
                         "bytes_per_token": x.bytes_per_token_layer * dims.layers,
                         "bytes_per_sequence": x.total(dims.layers, 1, args.context)} for x in layouts],
            "plans": [pl.to_dict() for pl in plans],
        })
        return 0
    mla = mla_bytes_per_token(dims)
    rows = [[x.layout, x.formula, f"{x.bytes_per_token_layer:,.0f}", f"{x.bytes_per_token_layer * dims.layers / 1e3:,.1f}",
             f"{x.total(dims.layers, 1, args.context) / 1e9:,.2f}", f"{x.bytes_per_token_layer / mla:,.1f}x"] for x in layouts]
    con = C.console()
    con.print(C.table(f"KV cache of {dims.name} (w={dims.w} B, {dims.layers} layers, context {args.context:,})",
                      ["layout", "formula", "B / token / layer", "KB / token", "GB / sequence", "vs MLA"], rows, right_from=2))
    prow = [[pl.layout, f"{pl.weights_bytes / 1e9:,.1f}", f"{pl.reserve_bytes / 1e9:,.1f}",
             f"{pl.cache_budget_bytes / 1e9:,.1f}", f"{pl.cache_bytes_per_token / 1e3:,.1f}", f"{pl.tokens:,}",
             f"{pl.sequences:,}"] for pl in plans]
    pl = plans[0]
    con.print(C.table(
        f"capacity per GPU: {dev.name} {mem_bytes / 1e9:,.0f} GB, tp={args.tp}, {pl.params / 1e9:,.1f}B params x "
        f"{pl.weight_bytes_per_param:g} B",
        ["cache", "weights GB", "reserve GB", "cache GB", "KB / token", "tokens", f"seqs of {args.context:,}"], prow))
    if not pl.fits:
        con.print("weights and reserve exceed the device memory: raise --tp or use fewer bytes per weight")
    return 0


def add(sub) -> None:
    p = sub.add_parser("memory", help="KV cache per token (MHA/GQA/MLA/hybrid) and the capacity plan",
                       description="KV-cache accounting and how much cache fits next to the weights.")
    C.add_model_args(p)
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"device key (default {DEFAULT_DEVICE})")
    C.add_devices_file_arg(p)
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--context", type=positive_int, default=32768, help="tokens per sequence (default 32768)")
    p.add_argument("--n", type=nonneg_int, default=1024, help="hybrid: newest tokens kept expanded (default 1024)")
    p.add_argument("--params", type=positive_float, help="total parameter count (default: the preset's published count)")
    p.add_argument("--weight-dtype", choices=sorted(DTYPE_BYTES), help="weight element type (default: the checkpoint's)")
    p.add_argument("--reserve-gb", type=nonneg_float, help="activation/workspace reserve in GB (default 10%% of memory)")
    p.add_argument("--memory-gb", type=positive_float, help="device memory in GB (default: the device's)")
    C.add_json_arg(p)
    p.set_defaults(func=run)
