"""Decode throughput of a transformers DeepSeek-V3-shaped model, stock against
``mla_var3.integrations.transformers.enable``, on a GPU.

The model: ``DeepseekV3ForCausalLM`` with DeepSeek-V3's attention (h = 128, k = 512, p = 64,
d = dv = 128, q_lora 1536, hidden 7,168, YaRN as the public config), ``LAYERS`` layers with small
dense MLPs (``MLP`` wide, no experts), a small vocabulary, random bf16 weights (transformers'
init), SDPA attention. No network: built from a config.

The context: every layer's cache holds ``CONTEXT`` tokens of every one of ``B`` sequences. The
same random latents (``z [B, T, K]``, ``kpe [B, T, P]``, what both the stock attention and ours
cache) fill every variant's cache, so no prefill is run and all variants decode from the same
state. Each timed call decodes ``STEPS`` tokens per sequence greedily (the model's own argmax
fed back) from that state; tokens/s = ``B * STEPS / time``. Between calls the caches go back to
the context (outside the timed window).

Variants (``rows``):

* ``stock``: transformers' ``DynamicCache`` (in transformers 5.2x it caches the latents and the
  attention expands K, V per head for all t keys at every step), eager.
* ``enabled``: ``enable(model)`` (mode "auto": the dispatcher's design per call) over an
  ``MLACache`` of ``LatentCache`` layers, eager; ``enabled_paged``: ``enable(model,
  paged=True)``, FlashMLA's paged layout.
* with CUDA graphs (one decode step captured, replayed ``STEPS`` times per timed call, the next
  token and position advanced inside the graph): ``stock_static_graph``, transformers'
  ``StaticCache`` (its static-cache path: fixed addresses, a device-side length; an explicit
  4D mask buffer whose next column is opened inside the graph), and ``enabled_paged_graph``, the
  paged ``MLACache`` reserved for the steps (appends in place; each layer's lengths are written
  back to the captured container inside the graph). transformers' static cache does not apply
  to the enabled model (its masks are built for the static length), so the graph of the enabled
  model runs over the paged cache. A variant that cannot be captured is recorded with its error.

Timing: the package's one primitive, ``mla_var3.runtime.timing.time_fn`` (CUDA events; the
variants reset state in ``setup``, so calls are timed as plain launches of the eager loop or of
the graph replays, the L2 flushed before each), plus ``host_time_us`` of one eager decode step
(the host's launch cost: above the GPU time, the eager decode is host-bound).

Checks (first): the first decode step's logits of each variant against the stock eager ones on
the same state (relative error at most ``TOLERANCE``: bf16 through four layers; a variant
that fails is not timed), and the share of equal greedy tokens after the first step and after
``STEPS`` steps (recorded: in bf16 a near-tie may flip a token and the sequences then part).
KV-cache bytes per variant: the cache tensors (``nbytes``), the buffers
behind them (reserved), and the per-head K/V the stock attention expands at every step.

Usage::

    python benchmarks/hf_decode.py --out benchmarks/results/h200/hf_decode.json      # H200: ~2-4 min
    python benchmarks/hf_decode.py --dry-run --out /tmp/hf_decode_dry.json            # CPU plumbing

Needs transformers (``pip install -e ".[hf]"``, or ``pip install --no-deps transformers`` beside
the GPU image's torch).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

from common import Budget, environment, error_text, timed, write_json

B, CONTEXT, STEPS, LAYERS, MLP, VOCAB = 32, 4096, 32, 4, 2048, 1024
WARMUP_STEPS = 3
#: relative error allowed between a variant's first-step logits and the stock eager ones (bf16)
TOLERANCE = 5e-2


# ------------------------------------------------------------------------------------ the model


def build(dry: bool, device, dtype):
    """(model, sizes): the DeepSeek-V3-shaped model (tiny in a dry run)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from mla_var3.model.config import DEEPSEEK_V3_ROPE
    from mla_var3.shapes import get_preset

    if dry:
        dims = dict(hidden=64, h=4, d=16, p=8, k=32, dv=16, q_lora_rank=24)
        sizes = dict(b=2, context=24, steps=3, layers=2, mlp=96, vocab=97)
    else:
        v3 = get_preset("deepseek-v3")
        dims = dict(hidden=v3.hidden, h=v3.h, d=v3.d, p=v3.p, k=v3.k, dv=v3.dv, q_lora_rank=v3.q_lora_rank)
        sizes = dict(b=B, context=CONTEXT, steps=STEPS, layers=LAYERS, mlp=MLP, vocab=VOCAB)
    rope = dict(DEEPSEEK_V3_ROPE)
    theta = rope.pop("rope_theta")
    config = DeepseekV3Config(
        vocab_size=sizes["vocab"], hidden_size=dims["hidden"], intermediate_size=sizes["mlp"],
        num_hidden_layers=sizes["layers"], first_k_dense_replace=sizes["layers"], num_attention_heads=dims["h"],
        num_key_value_heads=dims["h"], q_lora_rank=dims["q_lora_rank"], kv_lora_rank=dims["k"],
        qk_nope_head_dim=dims["d"], qk_rope_head_dim=dims["p"], v_head_dim=dims["dv"],
        rope_parameters={"rope_type": "yarn", "rope_theta": theta, **rope},
        max_position_embeddings=int(rope["factor"] * rope["original_max_position_embeddings"]),
        rope_interleave=True, attention_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    # built in ``dtype`` as ``from_pretrained(dtype=...)`` builds it: the RoPE frequencies stay
    # float32 (``model.to(bfloat16)`` would round them to bf16, and the stock model's rotations at
    # position 4,096 would then be off by radians)
    with torch.device(device):
        model = DeepseekV3ForCausalLM._from_config(config, dtype=dtype)
    return model.eval(), {**dims, **sizes}


def context_latents(sz: dict, device, dtype):
    """Per layer ``(z [B, T, K], kpe [B, T, P])``: the same random context for every variant."""
    gen = torch.Generator(device=device).manual_seed(1)
    shape = (sz["b"], sz["context"])
    return [(torch.randn(*shape, sz["k"], generator=gen, device=device).to(dtype),
             torch.randn(*shape, sz["p"], generator=gen, device=device).to(dtype)) for _ in range(sz["layers"])]


def cache_kwarg() -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (earlier releases)."""
    import inspect

    from transformers import DeepseekV3ForCausalLM

    return "cache" if "cache" in inspect.signature(DeepseekV3ForCausalLM.forward).parameters else "past_key_values"


def tensor_bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


# ------------------------------------------------------------------------------ the variants


class Variant:
    """A decode loop over one cache: ``run()`` decodes ``steps`` tokens from the context
    (``reset()`` first), ``first_logits`` are the logits of its first step."""

    def __init__(self, name: str, model, cache, sz: dict, first_token, reset):
        self.name, self.model, self.cache, self.sz = name, model, cache, sz
        self.first_token, self._reset = first_token, reset
        self.extra = {cache_kwarg(): cache}       # what every forward of the loop also takes

    def reset(self) -> None:
        self._reset()

    def step(self, token, position):
        return self.model(input_ids=token, position_ids=position, use_cache=True, **self.extra).logits[:, -1]

    def run(self):
        token, position = self.first_token, torch.full_like(self.first_token, self.sz["context"])
        for _ in range(self.sz["steps"]):
            token = self.step(token, position).argmax(-1, keepdim=True)
            position = position + 1
        return token

    def first_logits(self) -> torch.Tensor:
        self.reset()
        out = self.step(self.first_token, torch.full_like(self.first_token, self.sz["context"]))
        self.reset()
        return out.float()


class Graphed(Variant):
    """One decode step captured in a CUDA graph (run eagerly in a dry run): the next token, the
    position and the cache's length advance inside it; ``run()`` replays it ``steps`` times."""

    def __init__(self, name, model, cache, sz, first_token, reset, before=None, after=None):
        super().__init__(name, model, cache, sz, first_token, reset)
        self.before, self.after = before or (lambda: None), after or (lambda: None)
        self.token = first_token.clone()
        self.position = torch.full_like(first_token, sz["context"])
        self.logits = None
        self.replay = None

    def reset(self) -> None:
        self._reset()
        self.token.copy_(self.first_token)
        self.position.fill_(self.sz["context"])

    def _graph_step(self) -> None:
        self.before()
        logits = self.step(self.token, self.position)
        self.after()
        if self.logits is None:
            self.logits = torch.empty_like(logits)
        self.logits.copy_(logits)
        self.token.copy_(logits.argmax(-1, keepdim=True))
        self.position.add_(1)

    def capture(self) -> None:
        self.reset()
        if not self.first_token.is_cuda:
            self.replay = self._graph_step
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                self._graph_step()
        torch.cuda.current_stream().wait_stream(stream)
        self.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._graph_step()
        self.graph, self.replay = graph, graph.replay
        self.reset()

    def run(self):
        for _ in range(self.sz["steps"]):
            self.replay()
        return self.token

    def first_logits(self) -> torch.Tensor:
        self.reset()
        self.replay()
        out = self.logits.float().clone()
        self.reset()
        return out


def stock_variant(model, sz, latents, first_token):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for i, (z, kpe) in enumerate(latents):
        cache.update(z[:, None].contiguous(), kpe[:, None].contiguous(), i)

    def reset():
        extra = cache.get_seq_length() - sz["context"]
        if extra > 0:
            cache.crop(-extra)

    bytes_ = sum(tensor_bytes(layer.keys, layer.values) for layer in cache.layers)
    return Variant("stock", model, cache, sz, first_token, reset), dict(nbytes=bytes_, reserved_bytes=bytes_)


def stock_static_variant(model, sz, latents, first_token):
    from transformers import StaticCache

    t = sz["context"]
    length = t + sz["steps"] + WARMUP_STEPS + 1
    cache = StaticCache(config=model.config, max_cache_len=length)
    for i, (z, kpe) in enumerate(latents):
        cache.update(z[:, None].contiguous(), kpe[:, None].contiguous(), i)
    mask = torch.zeros(sz["b"], 1, 1, length, dtype=torch.bool, device=first_token.device)
    column = torch.tensor([t], device=first_token.device)

    def reset():
        for layer in cache.layers:
            layer.cumulative_length.fill_(t)
        mask.zero_()
        mask[..., :t] = True
        column.fill_(t)

    def before():                                        # the new token sees itself
        mask.index_fill_(3, column, True)
        column.add_(1)

    variant = Graphed("stock_static_graph", model, cache, sz, first_token, reset, before=before)
    variant.extra["attention_mask"] = mask
    bytes_ = sum(tensor_bytes(layer.keys, layer.values) for layer in cache.layers)
    return variant, dict(nbytes=bytes_, reserved_bytes=bytes_)


def enabled_variant(model, sz, latents, first_token, paged: bool, graphed: bool):
    from mla_var3.integrations.transformers import MLACache
    from mla_var3.model import LatentCache, PagedLatentCache

    cache = MLACache(paged=paged)
    room = sz["steps"] + WARMUP_STEPS + 1
    base = []
    for i, (z, kpe) in enumerate(latents):
        latent = LatentCache(z, kpe)
        base.append(PagedLatentCache.from_latent(latent).reserve(room) if paged else latent.reserve(sz["context"] + room))
        cache.layer(i).seen = sz["context"]

    def restore():
        for slot, state in zip(cache.layers, base):
            slot.state, slot.seen = state if paged else state.reserve(sz["context"] + room), sz["context"]

    def reset():
        if graphed:
            for state in base:
                state.seqlens.fill_(sz["context"])
        restore()

    def after():                                         # lengths written back into the captured containers
        for slot, state in zip(cache.layers, base):
            state.seqlens.copy_(slot.state.seqlens)
        restore()

    restore()
    name = "enabled" + ("_paged" if paged else "") + ("_graph" if graphed else "")
    variant = (Graphed(name, model, cache, sz, first_token, reset, after=after) if graphed
               else Variant(name, model, cache, sz, first_token, reset))
    return variant, dict(nbytes=cache.nbytes, reserved_bytes=sum(
        tensor_bytes(s.kv) if paged else s.reserved_bytes for s in base))


# --------------------------------------------------------------------------------- the run


def run(dry: bool, budget: Budget) -> dict:
    from mla_var3.integrations.transformers import disable, enable
    from mla_var3.runtime.timing import host_time_us
    from mla_var3.testing import rel_err

    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    model, sz = build(dry, device, dtype)
    latents = context_latents(sz, device, dtype)
    first_token = torch.randint(3, sz["vocab"], (sz["b"], 1), generator=torch.Generator().manual_seed(2)).to(device)
    w = torch.finfo(dtype).bits // 8
    res = dict(sizes=sz, dtype=str(dtype), variants={}, checks=[], rows=[],
               stock_expanded_kv_bytes_per_step=sz["layers"] * sz["b"] * sz["context"] * sz["h"]
               * (sz["d"] + sz["p"] + sz["dv"]) * w,
               latent_cache_bytes=sz["layers"] * sz["b"] * sz["context"] * (sz["k"] + sz["p"]) * w)
    timing = dict(warmup=1, reps=10, min_reps=3, max_seconds=3.0 if not dry else 0.5)

    def variants():
        yield lambda: stock_variant(model, sz, latents, first_token)
        yield lambda: stock_static_variant(model, sz, latents, first_token)
        enable(model)
        yield lambda: enabled_variant(model, sz, latents, first_token, paged=False, graphed=False)
        disable(model)
        enable(model, paged=True)
        yield lambda: enabled_variant(model, sz, latents, first_token, paged=True, graphed=False)
        yield lambda: enabled_variant(model, sz, latents, first_token, paged=True, graphed=True)
        disable(model)

    reference = final = None
    with torch.no_grad():
        for make in variants():
            variant = None
            try:
                variant, nbytes = make()
                if isinstance(variant, Graphed):
                    variant.capture()
                logits = variant.first_logits()
            except Exception as exc:  # noqa: BLE001 - a variant that fails (capture included) is recorded
                name = variant.name if variant is not None else "variant"
                res["variants"][name] = dict(error=error_text(exc, 600))
                print(f"  {name}: {res['variants'][name]['error']}", flush=True)
                traceback.print_exc()
                continue
            variant.reset()
            tokens = variant.run().clone()
            variant.reset()
            reference = logits if reference is None else reference
            final = tokens if final is None else final
            err = rel_err(logits, reference)
            same = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
            ok = bool(err <= TOLERANCE)
            res["checks"].append(dict(variant=variant.name, rel_err=err, same_greedy_token=same, ok=ok,
                                      same_token_after_steps=float((tokens == final).float().mean())))
            res["variants"][variant.name] = nbytes
            print(f"  {variant.name}: first-step logits rel. error {err:.1e}, same token {same:.0%}, "
                  f"cache {nbytes['nbytes'] / 2**20:.1f} MiB", flush=True)
            if not ok:
                continue
            us = timed(res["rows"], variant.name, variant.run, budget=budget,
                       timing=dict(timing, setup=variant.reset), steps=sz["steps"], b=sz["b"])
            if us is not None:
                res["rows"][-1]["tokens_per_s"] = sz["b"] * sz["steps"] / (us * 1e-6)
                res["rows"][-1]["us_per_step"] = us / sz["steps"]
            if not isinstance(variant, Graphed) and budget.left() > 0:
                variant.reset()
                host = host_time_us(lambda: variant.step(first_token, torch.full_like(first_token, sz["context"])),
                                    calls=20 if not dry else 3, warmup=2 if not dry else 1)
                variant.reset()
                res["rows"][-1]["host_us_per_step"] = host
    res["checks_ok"] = bool(res["checks"]) and all(c["ok"] for c in res["checks"])
    tps = {r["label"]: r.get("tokens_per_s") for r in res["rows"]}
    if tps.get("stock") and tps.get("enabled"):
        res["speedup_eager"] = tps["enabled"] / tps["stock"]
    if tps.get("stock_static_graph") and tps.get("enabled_paged_graph"):
        res["speedup_graph"] = tps["enabled_paged_graph"] / tps["stock_static_graph"]
    return res


def table(res: dict) -> str:
    lines = [f"| variant | µs/step | tokens/s | host µs/step | cache MiB | reserved MiB |", "|---|---|---|---|---|---|"]
    for row in res["rows"]:
        v = res["variants"].get(row["label"], {})
        cells = [row["label"], f"{row['us_per_step']:.0f}" if "us_per_step" in row else row.get("skipped", "-"),
                 f"{row['tokens_per_s']:,.0f}" if "tokens_per_s" in row else "-",
                 f"{row['host_us_per_step']:.0f}" if "host_us_per_step" in row else "-",
                 f"{v.get('nbytes', 0) / 2**20:.1f}", f"{v.get('reserved_bytes', 0) / 2**20:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for key in ("speedup_eager", "speedup_graph"):
        if key in res:
            lines.append(f"{key}: {res[key]:.2f}x")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="hf_decode.json")
    ap.add_argument("--dry-run", action="store_true", help="a tiny float32 model on the CPU: plumbing only")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds after which no new row is timed")
    args = ap.parse_args()
    dry = args.dry_run or not torch.cuda.is_available()
    t0 = time.time()
    env = environment(dry_run=dry)
    print(f"hf_decode: {env.get('device')} dry_run={dry}", flush=True)
    res = dict(env=env)
    try:
        import transformers

        res["transformers"] = transformers.__version__
        res.update(run(dry, Budget(args.budget)))
    except Exception as exc:  # noqa: BLE001
        res["error"] = error_text(exc, 800)
        traceback.print_exc()
    res["wall_s"] = time.time() - t0
    write_json(args.out, res)
    if res.get("rows"):
        print(table(res))
    print(f"wrote {args.out} ({res['wall_s']:.0f} s)")
    return 0 if res.get("checks_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
