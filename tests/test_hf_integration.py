"""mla_var3 inside transformers models (:mod:`mla_var3.integrations.transformers`): tiny random
DeepSeek-V2 and V3 models, the stock model's output against the enabled one's on the same
weights, in float32.

The bar (the integration's issue): greedy ``generate`` of 16 tokens for a left-padded batch of
three prompts of different lengths gives exactly the stock tokens; every step's logits, and a
plain forward's logits at every position (padding included), agree within a relative Frobenius
error of ``LOGITS_TOL``; after ``disable`` the stock modules and tokens are back.

Configs (``CONFIGS``): q_lora on/off, rope_interleave on/off (V2 has none: it always
interleaves), YaRN (with ``mscale_all_dim``, so the softmax scale changes too), ``v_head_dim``
below and above ``qk_nope_head_dim``, MoE and dense layers, attention bias. Sizes: hidden 64,
4 heads, 2 layers, vocabulary 97, weights drawn with std 0.2 (transformers' default 0.02 makes
the attention nearly uniform, which would hide position and mask errors). Each test takes well
under a second or two on one core.
"""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mla_var3.integrations.hf_cache import MLACacheLayer  # noqa: E402
from mla_var3.integrations.transformers import MLAAttention, MLACache, disable, enable, is_enabled  # noqa: E402
from mla_var3.testing import rel_err  # noqa: E402

LOGITS_TOL = 1e-4
#: the name transformers takes and returns the cache by (``past_key_values``, ``cache`` since 5.2x)
CACHE = "cache" if "cache" in inspect.signature(transformers.GenerationMixin.prepare_inputs_for_generation).parameters \
    else "past_key_values"
NEW_TOKENS = 16
PAD = 0

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
              max_position_embeddings=512, pad_token_id=PAD, bos_token_id=1, eos_token_id=2, initializer_range=0.2)
MOE = dict(moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128, beta_fast=32.0,
            beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)

#: name -> (architecture, config fields)
CONFIGS = {
    "v3-qlora-interleave": ("v3", dict(q_lora_rank=24, v_head_dim=16, first_k_dense_replace=1, n_group=2,
                                       topk_group=1, **MOE)),
    "v3-no-qlora-halfsplit": ("v3", dict(q_lora_rank=None, v_head_dim=16, rope_interleave=False,
                                         first_k_dense_replace=2)),
    "v3-yarn-dv<d": ("v3", dict(q_lora_rank=24, v_head_dim=12, rope_parameters=YARN, first_k_dense_replace=2)),
    "v2-qlora-dv>d": ("v2", dict(q_lora_rank=24, v_head_dim=24, first_k_dense_replace=1, **MOE)),
    "v2-lite-yarn-bias": ("v2", dict(q_lora_rank=None, v_head_dim=16, rope_parameters=YARN, attention_bias=True,
                                     first_k_dense_replace=2)),
}


def tiny_model(name: str, dtype=torch.float32, seed: int = 0):
    arch, fields = CONFIGS[name]
    if arch == "v3":
        config = transformers.DeepseekV3Config(**COMMON, **fields)
        cls = transformers.DeepseekV3ForCausalLM
    else:
        config = transformers.DeepseekV2Config(**COMMON, **fields)
        cls = transformers.DeepseekV2ForCausalLM
    torch.manual_seed(seed)
    return cls(config).to(dtype).eval()


def padded_prompts(lengths=(3, 7, 5), seed: int = 1):
    """input_ids and attention_mask of prompts of ``lengths`` tokens, left-padded."""
    gen = torch.Generator().manual_seed(seed)
    t = max(lengths)
    ids = torch.full((len(lengths), t), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, t - n:] = torch.randint(3, COMMON["vocab_size"], (n,), generator=gen)
    return ids, (ids != PAD).long()


def greedy(model, ids, mask, **kw):
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         return_dict_in_generate=True, output_logits=True, **kw)
    return out.sequences, torch.stack(out.logits), out


def returned_cache(out):
    return getattr(out, CACHE)


def assert_steps_close(got, ref, name=""):
    for step, (a, b) in enumerate(zip(got, ref)):
        assert rel_err(a, b) <= LOGITS_TOL, f"{name} step {step}: {rel_err(a, b):.2e}"


@pytest.mark.parametrize("name", CONFIGS)
def test_generate_gives_the_stock_tokens(name):
    model = tiny_model(name)
    ids, mask = padded_prompts()
    ref_tokens, ref_logits, _ = greedy(model, ids, mask)
    ref_forward = model(input_ids=ids, attention_mask=mask).logits
    originals = [layer.self_attn for layer in model.model.layers]

    assert enable(model) is model and is_enabled(model)
    assert all(isinstance(layer.self_attn, MLAAttention) for layer in model.model.layers)
    tokens, logits, out = greedy(model, ids, mask)
    assert torch.equal(tokens, ref_tokens), f"{name}: tokens differ\n{tokens}\n{ref_tokens}"
    assert_steps_close(logits, ref_logits, name)
    forward = model(input_ids=ids, attention_mask=mask).logits
    assert rel_err(forward, ref_forward) <= LOGITS_TOL            # padded positions included

    cache = returned_cache(out)
    assert isinstance(cache, MLACache) and isinstance(out.past_key_values, MLACache)
    real = mask.sum(1) + NEW_TOKENS - 1                           # the last token is generated, not fed
    assert cache.seqlens().tolist() == real.tolist()
    assert cache.get_seq_length() == ids.shape[1] + NEW_TOKENS - 1   # what transformers counts: padding too
    cfg = model.model.layers[0].self_attn.mla.cfg
    assert cache.nbytes == 2 * 3 * int(real.max()) * (cfg.k + cfg.p) * 4      # layers * b * t * (k + p) * w

    assert disable(model) is model and not is_enabled(model)
    assert [layer.self_attn for layer in model.model.layers] == originals
    tokens, _, _ = greedy(model, ids, mask)
    assert torch.equal(tokens, ref_tokens)


@pytest.mark.parametrize("mode,paged", [("absorbed", False), ("naive", False), ("hybrid", False),
                                        ("auto", True), ("absorbed", True)])
def test_every_mode_and_the_paged_cache(mode, paged):
    """Each layer mode (the hybrid with a window of 4 tokens, so that tokens leave it, and the
    padded prefill re-splits it) and the paged latent cache, with a prompt batch that is not
    padded and one that is, and beam search (cache reordering)."""
    model = tiny_model("v3-yarn-dv<d")
    ids, mask = padded_prompts((6, 2, 4), seed=2)
    ref_tokens, ref_logits, _ = greedy(model, ids, mask)
    ref_full, _, _ = greedy(model, ids[:, -2:], None)
    ref_beam = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=2, do_sample=False)
    enable(model, mode=mode, paged=paged)
    for layer in model.model.layers:
        layer.self_attn.mla.cfg = layer.self_attn.mla.cfg.replace(hybrid_n=4)
    tokens, logits, out = greedy(model, ids, mask)
    assert torch.equal(tokens, ref_tokens)
    assert_steps_close(logits, ref_logits, mode)
    state = returned_cache(out).layers[0].state
    assert state.kind == {"naive": "expanded", "hybrid": "hybrid"}.get(mode, "paged" if paged else "latent")
    if mode == "hybrid":
        assert state.n == 4 and state.k_win.shape[1] == 4
    assert torch.equal(greedy(model, ids[:, -2:], None)[0], ref_full)
    beam = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=2, do_sample=False)
    assert torch.equal(beam, ref_beam)


def test_sampling_and_a_continued_cache():
    """Sampling with the same seed draws the same tokens; a second generate that goes on from
    the returned cache (the conversation's next turn) gives the stock continuation."""
    model = tiny_model("v2-qlora-dv>d")
    ids, mask = padded_prompts((4, 6, 1), seed=3)

    def run():
        torch.manual_seed(7)
        first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=True, top_k=20,
                               temperature=0.9, return_dict_in_generate=True)
        turn = torch.cat([first.sequences, torch.randint(3, 97, (3, 2), generator=torch.Generator().manual_seed(4))], 1)
        turn_mask = torch.cat([mask, torch.ones(3, turn.shape[1] - mask.shape[1], dtype=torch.long)], 1)
        second = model.generate(input_ids=turn, attention_mask=turn_mask, **{CACHE: returned_cache(first)},
                                max_new_tokens=6, do_sample=False)
        return first.sequences, second

    ref_first, ref_second = run()
    enable(model)
    first, second = run()
    assert torch.equal(first, ref_first) and torch.equal(second, ref_second)


def test_prompt_lookup_decoding_crops_the_cache():
    """Prompt-lookup (assisted) decoding drafts tokens from the prompt and cuts the rejected
    ones from the cache (``MLACacheLayer.crop``): the stock tokens, with tokens really cut."""
    model = tiny_model("v3-qlora-interleave")
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    kw = dict(input_ids=ids, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=3)
    ref = model.generate(**kw)
    enable(model)
    cut = []
    crop = MLACacheLayer.crop

    def counting(self, n):
        cut.append(n)
        return crop(self, n)

    MLACacheLayer.crop = counting
    try:
        assert torch.equal(model.generate(**kw), ref)
    finally:
        MLACacheLayer.crop = crop
    assert min(cut) < 0


def test_forward_without_a_cache_shares_the_weights_and_keeps_the_keys():
    model = tiny_model("v3-qlora-interleave")
    ids, mask = padded_prompts()
    ref = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    keys = list(model.state_dict())
    attn = model.model.layers[1].self_attn
    enable(model)
    adapter = model.model.layers[1].self_attn
    out = model(input_ids=ids, attention_mask=mask, use_cache=False)
    assert returned_cache(out) is None and rel_err(out.logits, ref) <= LOGITS_TOL
    out = model(input_ids=ids, attention_mask=mask, **{CACHE: MLACache(paged=True)})     # the caller's choice
    assert returned_cache(out).layers[0].state.kind == "paged" and rel_err(out.logits, ref) <= LOGITS_TOL
    assert adapter.original is attn and adapter.layer_idx == 1
    for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"):
        assert getattr(adapter.mla, name) is getattr(attn, name)                 # the same modules: no copy
    assert list(model.state_dict()) == keys                                      # the stock checkpoint keys
    model.load_state_dict(model.state_dict())
    assert len(list(model.parameters())) == len(list(disable(model).parameters()))


def test_the_dtype_is_kept():
    """A bf16 model stays bf16 (weights, activations, cache); its logits are near the stock
    bf16 model's (different roundings: tolerance 3e-2)."""
    model = tiny_model("v3-qlora-interleave", dtype=torch.bfloat16)
    ids, mask = padded_prompts()
    ref = model(input_ids=ids, attention_mask=mask).logits
    enable(model)
    out = model(input_ids=ids, attention_mask=mask)
    assert model.dtype == torch.bfloat16 and out.logits.dtype == torch.bfloat16
    assert {p.dtype for n, p in model.named_parameters() if "self_attn" in n} == {torch.bfloat16}
    assert returned_cache(out).layers[0].state.z.dtype == torch.bfloat16
    assert rel_err(out.logits.float(), ref.float()) <= 3e-2
    assert model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4).shape == (3, 11)


def test_a_model_without_mla_is_refused():
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)
    with pytest.raises(ValueError, match="LlamaForCausalLM has no MLA attention"):
        enable(model)
    assert not is_enabled(model)


def test_bad_calls_are_clear_errors():
    model = tiny_model("v3-no-qlora-halfsplit")
    ids, mask = padded_prompts()
    with pytest.raises(ValueError, match="mode must be one of"):
        enable(model, mode="fast")
    with pytest.raises(ValueError, match="paged=True keeps a paged latent cache"):
        enable(model, mode="naive", paged=True)
    if hasattr(torch, "float8_e4m3fn"):                     # a quantized checkpoint: refused, named
        attn = model.model.layers[1].self_attn
        weight = attn.kv_b_proj.weight
        attn.kv_b_proj.weight = torch.nn.Parameter(weight.detach().to(torch.float8_e4m3fn), requires_grad=False)
        with pytest.raises(ValueError, match=r"model.layers.1.self_attn: .*kv_b_proj.weight is torch.float8_e4m3fn"):
            enable(model)
        attn.kv_b_proj.weight = weight
        assert not is_enabled(model)
    stock_cache = transformers.DynamicCache(config=model.config)
    model(input_ids=ids, attention_mask=mask, **{CACHE: stock_cache})
    enable(model)
    with pytest.raises(ValueError, match="enabled on this model already"):
        enable(model)
    with pytest.raises(ValueError, match="already holds keys and values of the stock attention"):
        model(input_ids=ids, attention_mask=mask, **{CACHE: stock_cache})
    with pytest.raises(ValueError, match="StaticCache.*is not supported"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, cache_implementation="static")
    ours = returned_cache(model(input_ids=ids, attention_mask=mask))
    disable(model)
    with pytest.raises(ValueError, match="an MLACache holds mla_var3 cache containers"):
        model(input_ids=ids[:, -1:], **{CACHE: ours})


def test_decode_benchmark_dry_run(tmp_path):
    """benchmarks/hf_decode.py --dry-run: the GPU script's plumbing (every variant, the graph
    variants' steps run eagerly) on a tiny float32 model, where every variant decodes the stock
    tokens."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "hf_decode.py"
    out = tmp_path / "dry.json"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run([sys.executable, str(script), "--dry-run", "--out", str(out)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    names = ["stock", "stock_static_graph", "enabled", "enabled_paged", "enabled_paged_graph"]
    assert res["checks_ok"] and [c["variant"] for c in res["checks"]] == names
    assert all(c["rel_err"] <= LOGITS_TOL and c["same_token_after_steps"] == 1.0 for c in res["checks"])
    assert [r["label"] for r in res["rows"]] == names and all(r["tokens_per_s"] > 0 for r in res["rows"])
    assert res["variants"]["enabled"]["nbytes"] == res["latent_cache_bytes"]
