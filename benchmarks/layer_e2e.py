"""End to end: one MLA attention layer (projections + RoPE + attention + o_proj) at DeepSeek-V3
dims, ours in ``mode="auto"`` against ``transformers``' ``DeepseekV3Attention`` with the same
weights (eager and SDPA attention implementations).

For each step size s (decode s = 1, speculative s = 4 and 16) the cache holds ``t - s`` tokens
of context and the step adds s, so attention runs over t keys. Reported per implementation:
time per step (median of CUDA-event timed calls, L2 overwritten before each, caches reset
outside the timed window; a hybrid cache is copied into fresh buffers before each call, so the
timed call extends it in place as a decode loop does), the time of the attention part alone (ours: the dispatched
``mla_attention`` over the cache; transformers: K/V expansion when its cache is latent, then its
attention function) and its share of the step, and the relative error of the step's output
against transformers' eager output (tolerance ``TOLERANCE``: bf16 everywhere, six chained
projections).

No network: the transformers module is built from a config dict (the public DeepSeek-V3
config's attention fields, dims from ``mla_var3.shapes``), with random weights copied into ours.

Usage (GPU; torch 2.11, transformers 5.x)::

    PYTHONPATH=src python benchmarks/layer_e2e.py --out benchmarks/results/h200/layer_e2e
    python benchmarks/layer_e2e.py --small --out /tmp/e2e      # a CPU smoke run at tiny dims

Writes ``layer_e2e.json`` and ``layer_e2e.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from common import environment
from mla_var3.dispatch import Dispatcher
from mla_var3.model import HybridCache, MLAConfig, MLALayer, mla_attention
from mla_var3.model.config import DEEPSEEK_V3_ROPE
from mla_var3.runtime.timing import Timing, time_fn
from mla_var3.shapes import get_preset
from mla_var3.testing import rel_err

#: relative Frobenius error allowed between our step output and transformers' eager output.
TOLERANCE = 2e-2
PREFILL_CHUNK = 512


# ------------------------------------------------------------------------- transformers adapters


def hf_config_dict(dims, small: bool) -> dict:
    """The attention fields of DeepSeek-V3's config.json (dims from the preset)."""
    rope = dict(DEEPSEEK_V3_ROPE)
    theta = rope.pop("rope_theta")
    return {
        "model_type": "deepseek_v3", "hidden_size": dims.hidden, "num_attention_heads": dims.h,
        "num_key_value_heads": dims.h, "q_lora_rank": dims.q_lora_rank, "kv_lora_rank": dims.k,
        "qk_nope_head_dim": dims.d, "qk_rope_head_dim": dims.p, "v_head_dim": dims.dv,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": theta, **rope},
        "max_position_embeddings": int(rope["factor"] * rope["original_max_position_embeddings"]),
        "rope_interleave": True, "rms_norm_eps": 1e-6, "attention_bias": False, "attention_dropout": 0.0,
        "num_hidden_layers": 1, "vocab_size": 128 if small else 129280,
    }


def hf_modules(config_dict: dict, dtype, device):
    """(attention module, rotary embedding, config) of transformers' DeepSeek-V3."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    cfg = DeepseekV3Config(**{k: v for k, v in config_dict.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    attn = DeepseekV3Attention(cfg, layer_idx=0).to(dtype=dtype, device=device).eval()
    rope = DeepseekV3RotaryEmbedding(config=cfg).to(device)
    return attn, rope, cfg


def hf_cache(cfg):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=cfg)
    except TypeError:
        return DynamicCache()


def hf_crop(cache, length: int) -> None:
    """Cut the cache back to ``length`` tokens (a negative ``crop`` removes tokens from the end in
    every transformers version that has it)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def hf_mask(b: int, s: int, length: int, dtype, device):
    """Additive bottom-right causal mask [b, 1, s, length] (None for s = 1: nothing to mask)."""
    if s == 1:
        return None
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    mask = torch.zeros(s, length, dtype=dtype, device=device)
    mask[j > length - s + i] = torch.finfo(dtype).min
    return mask.expand(b, 1, s, length)


def _cache_kwarg() -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (earlier) in the attention's forward."""
    import inspect

    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    params = inspect.signature(DeepseekV3Attention.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


_CACHE_KWARG = "past_key_values"


def hf_step(attn, rope, cfg, impl: str, x, positions, cache, length: int):
    """One transformers attention call of x [b, s, hidden] over ``cache`` (which it extends)."""
    cfg._attn_implementation = impl
    pos_emb = rope(x, positions)
    mask = hf_mask(x.shape[0], x.shape[1], length, x.dtype, x.device)
    try:
        out = attn(x, pos_emb, mask, **{_CACHE_KWARG: cache})
    except TypeError:
        out = attn(x, pos_emb, mask, past_key_values=cache)
    return out[0]


def hf_attention_part(attn, cfg, impl: str, cache, b: int, s: int, length: int, dtype, device):
    """The attention part of a transformers step alone: a callable on tensors of the step's
    shapes (K/V expansion first when the module expands a latent cache, as transformers 5.2x do)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import eager_attention_forward

    cfg._attn_implementation = impl
    fn = ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager_attention_forward) if hasattr(
        ALL_ATTENTION_FUNCTIONS, "get_interface") else (eager_attention_forward if impl == "eager" else
                                                       ALL_ATTENTION_FUNCTIONS[impl])
    h, qk = attn.num_heads, attn.qk_head_dim
    q = torch.randn(b, h, s, qk, dtype=dtype, device=device)
    mask = hf_mask(b, s, length, dtype, device)
    if hasattr(attn, "expand_kv"):
        kv_nope = torch.randn(b, 1, length, attn.kv_lora_rank, dtype=dtype, device=device)
        k_rot = torch.randn(b, 1, length, attn.qk_rope_head_dim, dtype=dtype, device=device)

        def run():
            k, v = attn.expand_kv(kv_nope, k_rot)
            return fn(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
    else:
        k = torch.randn(b, h, length, qk, dtype=dtype, device=device)
        v = torch.randn(b, h, length, attn.v_head_dim, dtype=dtype, device=device)

        def run():
            return fn(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling)
    return run


# ------------------------------------------------------------------------------------- timing


def time_calls(fn, reset=None, reps: int = 20) -> Timing:
    """``fn()`` timed with the package's primitive: plain launches between CUDA events (no graph:
    the step's host work counts), L2 overwritten and ``reset()`` run before each call, untimed."""
    return time_fn(fn, setup=reset, warmup=3, reps=reps, min_reps=3, max_seconds=20.0, use_graph=False)


# ------------------------------------------------------------------------------------- the run


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dims = get_preset("deepseek-v3")
    if args.small:
        dims = dims.replace(h=4, d=16, p=16, k=32, dv=16, hidden=64, q_lora_rank=48, name="deepseek-v3/small")
    b, t, steps = args.b, args.t, sorted(args.s)
    config_dict = hf_config_dict(dims, args.small)
    cfg = MLAConfig.from_hf_config(config_dict)
    torch.manual_seed(0)
    ours = MLALayer.random(cfg, dtype=dtype, device=device, seed=0).eval()
    attn, rope, hf_cfg = hf_modules(config_dict, dtype, device)
    global _CACHE_KWARG
    _CACHE_KWARG = _cache_kwarg()
    attn.load_state_dict(ours.state_dict(), strict=True)
    dispatcher = Dispatcher(None if device.type == "cuda" else "h200", dtype=args.dtype if args.dtype != "fp32" else "bf16")
    ours.dispatcher = dispatcher
    if args.backend:
        ours.backend = args.backend

    gen = torch.Generator(device="cpu").manual_seed(1)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)  # noqa: E731
    base = t - max(steps)
    ctx = rand(b, base, cfg.hidden)
    variants = {"ours_auto_latent": None}
    if args.hybrid_window:
        variants["ours_auto_hybrid"] = args.hybrid_window
    caches = {}
    with torch.no_grad():
        # ---- prefill the same context into every cache, in chunks
        for name, window in variants.items():
            cache = None
            for lo in range(0, base, PREFILL_CHUNK):
                hi = min(base, lo + PREFILL_CHUNK)
                pos = torch.arange(lo, hi, device=device).expand(b, hi - lo)
                _, cache = ours(ctx[:, lo:hi], pos, cache=cache, mode="auto", n=window if lo == 0 else None)
            caches[name] = cache
        hf = hf_cache(hf_cfg)
        for lo in range(0, base, PREFILL_CHUNK):
            hi = min(base, lo + PREFILL_CHUNK)
            pos = torch.arange(lo, hi, device=device).expand(b, hi - lo)
            hf_step(attn, rope, hf_cfg, "sdpa", ctx[:, lo:hi], pos, hf, hi)
        records = []
        for s in steps:
            # ---- grow every cache to t - s with the same filler tokens, then the step's tokens
            fill = rand(b, max(steps) - s, cfg.hidden)
            x = rand(b, s, cfg.hidden)
            pos_fill = torch.arange(base, t - s, device=device).expand(b, max(steps) - s)
            pos = torch.arange(t - s, t, device=device).expand(b, s)
            step_caches = {}
            for name in variants:
                c = caches[name]
                if fill.shape[1]:
                    _, c = ours(fill, pos_fill, cache=c, mode="auto")
                step_caches[name] = c
            hf_crop(hf, base)
            if fill.shape[1]:
                hf_step(attn, rope, hf_cfg, "sdpa", fill, pos_fill, hf, t - s)
            ref = hf_step(attn, rope, hf_cfg, "eager", x, pos, hf, t)
            hf_crop(hf, t - s)
            for name, c in step_caches.items():
                out, _ = ours(x, pos, cache=c, mode="auto")
                dec = ours.last_decision
                err = rel_err(out, ref)
                # a decode step extends the newest cache in place (HybridCache): before each timed
                # call (untimed) the cache is copied into fresh buffers with room for the step
                held = {"c": c}
                reset = (lambda c=c, held=held: held.update(c=c.reserve(c.max_len + s))) if isinstance(
                    c, HybridCache) else None
                total = time_calls(lambda held=held: ours(x, pos, cache=held["c"], mode="auto"), reset=reset,
                                   reps=args.reps)
                # the attention part alone: the dispatched call over the cache holding the step
                q_nope, q_pe, _, _ = ours.project(x, pos)
                _, c_after = ours(x, pos, cache=c, mode="auto")
                w = ours.absorbed
                part = time_calls(lambda c_after=c_after: mla_attention(
                    q_nope, q_pe, c_after, w.w_uk, w.w_uv, scale=cfg.softmax_scale, dispatcher=dispatcher,
                    backend=ours.backend), reps=args.reps)
                records.append(_record(name, s, b, t, total, part, err, design=dec.design, n=dec.n,
                                       source=dec.source, reason=dec.reason,
                                       predicted_us={k: v * 1e6 for k, v in dec.predicted_s.items()}))
            for impl in ("eager", "sdpa"):
                hf_crop(hf, t - s)
                out = hf_step(attn, rope, hf_cfg, impl, x, pos, hf, t)
                hf_crop(hf, t - s)
                err = rel_err(out, ref)
                total = time_calls(lambda impl=impl: hf_step(attn, rope, hf_cfg, impl, x, pos, hf, t),
                                   reset=lambda: hf_crop(hf, t - s), reps=args.reps)
                part = time_calls(hf_attention_part(attn, hf_cfg, impl, hf, b, s, t, dtype, device), reps=args.reps)
                records.append(_record(f"transformers_{impl}", s, b, t, total, part, err))
    return {"meta": _meta(args, dims, device, dispatcher), "records": records}


def _record(name, s, b, t, total: Timing, part: Timing, err, **extra) -> dict:
    return {"name": name, "b": b, "s": s, "t": t, "step_us": total.median_us, "step_p10_us": total.p10_us,
            "step_p90_us": total.p90_us, "reps": total.reps, "attention_us": part.median_us,
            "attention_share": min(1.0, part.median_us / total.median_us),
            "rel_err_vs_transformers_eager": err, "within_tolerance": bool(err <= TOLERANCE), **extra}


def _meta(args, dims, device, dispatcher) -> dict:
    import transformers

    env = environment(transformers=transformers.__version__)
    return {"model": dims.name, "dims": {k: getattr(dims, k) for k in ("h", "d", "p", "k", "dv", "hidden", "q_lora_rank")},
            "dtype": args.dtype, "device": env["device"], "environment": env,
            "dispatcher_device": dispatcher.resolve_device().key, "tolerance": TOLERANCE,
            "tolerance_rule": "relative Frobenius error of the step output vs transformers eager, same weights",
            "timing": ("mla_var3.runtime.timing.time_fn without CUDA graphs: median of CUDA-event timed calls, >= 2x "
                       "L2 overwritten and caches reset before each, outside the timed window" if device.type == "cuda"
                       else "perf_counter on the CPU (smoke run)"),
            "attention_part": ("ours: mla_attention over the cache holding the step (design from the dispatcher); "
                               "transformers: expand_kv of the cached latent (when its cache is latent) + its "
                               "attention function"),
            "hybrid_window": args.hybrid_window}


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = result["records"]
    names = list(dict.fromkeys(r["name"] for r in recs))
    steps = sorted({r["s"] for r in recs})
    fig, axes = plt.subplots(1, len(steps), figsize=(4.2 * len(steps), 4.2), squeeze=False)
    for ax, s in zip(axes[0], steps):
        rows = {r["name"]: r for r in recs if r["s"] == s}
        xs = range(len(names))
        attn = [rows[n]["attention_us"] / 1e3 if n in rows else 0 for n in names]
        rest = [max(0.0, rows[n]["step_us"] - rows[n]["attention_us"]) / 1e3 if n in rows else 0 for n in names]
        ax.bar(xs, attn, label="attention")
        ax.bar(xs, rest, bottom=attn, label="projections, RoPE, cache")
        ax.set_xticks(list(xs), [n.replace("transformers_", "HF ").replace("ours_auto_", "ours auto\n") for n in names],
                      fontsize=8)
        for i, n in enumerate(names):
            if n in rows and "design" in rows[n]:
                ax.text(i, attn[i] + rest[i], rows[n]["design"], ha="center", va="bottom", fontsize=7)
        ax.set_title(f"s = {s}")
        ax.set_ylabel("ms per step")
    axes[0][0].legend(fontsize=8)
    m = result["meta"]
    fig.suptitle(f"one MLA layer, {m['model']} b={recs[0]['b']} t={recs[0]['t']} {m['dtype']} on {m['device']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder for layer_e2e.json and layer_e2e.png")
    p.add_argument("--b", type=int, default=32)
    p.add_argument("--t", type=int, default=4096)
    p.add_argument("--s", type=lambda x: [int(v) for v in x.split(",")], default=[1, 4, 16])
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--hybrid-window", type=int, default=1024,
                   help="also run ours over a HybridCache of this window (0: latent cache only)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", choices=("auto", "reference", "kernel"), help="our attention backend (default auto)")
    p.add_argument("--small", action="store_true", help="tiny dims, for a CPU smoke run (b, t default 2, 128)")
    args = p.parse_args(argv)
    if args.small and args.b == 32 and args.t == 4096:
        args.b, args.t, args.hybrid_window = 2, 128, min(args.hybrid_window, 32)
    if args.t < max(args.s):
        p.error(f"--t {args.t} must be >= every s")
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "layer_e2e.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    plot(result, out / "layer_e2e.png")
    for r in result["records"]:
        print(f"s={r['s']:>3} {r['name']:<22} step {r['step_us']:>11,.1f} µs  attention {r['attention_us']:>11,.1f} µs "
              f"({r['attention_share']:.0%})  err {r['rel_err_vs_transformers_eager']:.2e}"
              + (f"  [{r['design']}{'' if r.get('n') is None else ' n=' + str(r['n'])}]" if "design" in r else ""))
    bad = [r for r in result["records"] if not r["within_tolerance"]]
    print(f"wrote {out / 'layer_e2e.json'} and {out / 'layer_e2e.png'}; "
          + (f"{len(bad)} record(s) above the tolerance {TOLERANCE}" if bad else f"all outputs within {TOLERANCE}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

