"""``mla-var3 devices``: the devices table with ridge points; ``--measure`` times this GPU's
ceilings (torch is imported only then) and ``--write`` adds them to a user devices file."""

from __future__ import annotations

from mla_var3._argtypes import path_arg
from mla_var3.analysis.devices import DEVICES_ENV, load_devices
from mla_var3.cli import _common as C


def run(args) -> int:
    if args.measure:
        return _measure(args)
    if args.write:
        raise ValueError("--write needs --measure")
    devices = load_devices(args.devices_file)
    if args.json:
        out = []
        for dev in devices.values():
            ds = dev.ceilings("datasheet")
            ms = dev.ceilings("measured")
            out.append({
                "key": dev.key, "name": dev.name, "bf16_tflops": dev.bf16_tflops, "fp8_tflops": dev.fp8_tflops,
                "bandwidth_gbs": dev.bandwidth_gbs, "memory_gb": dev.memory_gb, "sms": dev.sms, "l2_mb": dev.l2_mb,
                "smem_per_sm_kb": dev.smem_per_sm_kb, "ridge_datasheet": ds.ridge,
                "ridge_measured": ms.ridge if ms.kind == "measured" else None,
                "measured": dev.measured, "sources": dev.sources,
                "read_by_sms": dev.read_by_sms_block(),
                "window_by_sms": dev.window_by_sms_block(),
            })
        C.print_json(out)
        return 0
    rows = []
    for dev in devices.values():
        ms = dev.ceilings("measured")
        measured = (f"{ms.flops_per_s / 1e12:,.0f} / {ms.bytes_per_s / 1e9:,.0f} / {ms.ridge:.1f}"
                    if ms.kind == "measured" else "-")
        rows.append([dev.key, dev.name, f"{dev.bf16_tflops:,.1f}", f"{dev.fp8_tflops:,.1f}" if dev.fp8_tflops else "-",
                     f"{dev.bandwidth_gbs:,.0f}", f"{dev.memory_gb:g}", dev.sms or "-", f"{dev.l2_mb:g}" if dev.l2_mb else "-",
                     f"{dev.smem_per_sm_kb:g}" if dev.smem_per_sm_kb else "-", f"{dev.ridge('datasheet'):.1f}", measured])
    C.console().print(C.table(
        "devices (dense tensor-core peaks; ridge = peak FLOP/s / bandwidth, FLOP/byte)",
        ["key", "name", "bf16 TFLOP/s", "fp8 TFLOP/s", "GB/s", "memory GB", "SMs", "L2 MB", "smem/SM KB", "ridge",
         "measured TFLOP/s / GB/s / ridge"], rows, right_from=2))
    return 0


def _measure(args) -> int:
    import torch

    from mla_var3.analysis.devices import match_device_name
    from mla_var3.runtime.ceilings import (
        NoGPUError, device_entry, measure_ceilings, measure_read_by_sms, write_user_device,
    )
    from mla_var3.runtime.environment import device_name, device_slug

    if not torch.cuda.is_available():
        raise ValueError("devices --measure needs a CUDA GPU (it times a device-to-device copy and a bf16 matmul); "
                         "none is visible here")
    try:
        measured = measure_ceilings()
        by_sms = measure_read_by_sms()
    except NoGPUError as exc:
        raise ValueError(str(exc)) from None
    name = device_name()
    base = match_device_name(name, args.devices_file)
    rows = [["copy bandwidth (GB/s, read+write)", f"{measured.bytes_per_s / 1e9:,.0f}",
             f"{base.bandwidth_gbs:,.0f}" if base else "-"],
            ["bf16 matmul (TFLOP/s)", f"{measured.flops_per_s / 1e12:,.0f}", f"{base.bf16_tflops:,.1f}" if base else "-"],
            ["ridge (FLOP/byte)", f"{measured.ridge:.1f}", f"{base.ridge('datasheet'):.1f}" if base else "-"]]
    C.console().print(C.table(f"{name}: measured in this process vs datasheet"
                              f" ({base.key if base else 'not in the devices table'})",
                              ["ceiling", "measured", "datasheet"], rows))
    print(measured.source)
    recorded = dict(base.read_by_sms or ()) if base else {}
    C.console().print(C.table("HBM read bandwidth by SM count (what m SMs can pull; a kernel on part of the GPU is "
                              "bounded by it)", ["SMs", "TB/s", "GB/s per SM", "recorded GB/s per SM"],
                              [[m, f"{g / 1e3:,.2f}", f"{g / m:,.0f}",
                                f"{recorded[m] / m:,.0f}" if m in recorded else "-"] for m, g in by_sms[0]],
                              right_from=0))
    print(by_sms[1] + (f"; recorded: {base.read_by_sms_source}" if base and base.read_by_sms else ""))
    if args.write:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        entry = device_entry(measured, base=base, name=name, memory_gb=round(props.total_memory / 1e9, 1),
                             sms=props.multi_processor_count, read_by_sms=by_sms)
        key = base.key if base else device_slug(name)
        write_user_device(args.write, key, entry)
        print(f"wrote device {key!r} with the measured ceilings to {args.write} "
              f"(use it with --devices-file {args.write} or ${DEVICES_ENV})")
    return 0


def add(sub) -> None:
    p = sub.add_parser("devices", help="the devices table with ridge points", description="Known devices and their ceilings.")
    C.add_devices_file_arg(p)
    p.add_argument("--measure", action="store_true",
                   help="measure this GPU's copy bandwidth, bf16 matmul rate and HBM read bandwidth by SM count "
                        "and print them beside the datasheet and the recorded curve")
    p.add_argument("--write", type=path_arg, metavar="PATH", help="with --measure: add the measured ceilings to this user devices file")
    C.add_json_arg(p)
    p.set_defaults(func=run)
