"""Loading the layer from a state dict and from .safetensors files (HF key names, optional
prefix, shards, FP8 block scales), clear errors for bad weights, and the absorption views."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from mla_var3.model import MLAConfig, MLALayer, absorbed_weights
from mla_var3.model.weights import dequantize_fp8_blocks

F64 = torch.float64
PREFIX = "model.layers.3.self_attn."


def cfg_for(preset="deepseek-v3", **changes):
    return MLAConfig.from_preset(preset).scaled(div=8, h=4).replace(**changes)


def prefixed(layer, prefix=PREFIX):
    return {prefix + key: value.clone() for key, value in layer.state_dict().items()}


def same_layer(a: MLALayer, b: MLALayer, cfg):
    for (name, x), (name_b, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert name == name_b and torch.equal(x, y), name
    x = torch.randn(2, 3, cfg.hidden, dtype=a.kv_b_proj.weight.dtype)
    pos = torch.arange(3).expand(2, 3)
    assert torch.equal(a(x, pos, mode="absorbed")[0], b(x, pos, mode="absorbed")[0])


@pytest.mark.parametrize("preset,bias", [("deepseek-v3", False), ("deepseek-v2-lite", True)])
def test_state_dict_round_trip(preset, bias):
    cfg = cfg_for(preset, attention_bias=bias)
    layer = MLALayer.random(cfg, dtype=F64, seed=1)
    keys = set(layer.state_dict())
    assert ("q_proj.weight" in keys) == (cfg.q_lora_rank is None)
    assert ("o_proj.bias" in keys) == bias and ("kv_a_proj_with_mqa.bias" in keys) == bias
    same_layer(MLALayer.from_state_dict(cfg, layer.state_dict()), layer, cfg)
    # a whole-model state dict: other layers' and modules' keys are outside the prefix
    sd = prefixed(layer)
    sd.update({"model.layers.4.self_attn.o_proj.weight": torch.zeros(3), "model.embed_tokens.weight": torch.zeros(2),
               PREFIX + "rotary_emb.inv_freq": torch.zeros(4)})
    loaded = MLALayer.from_state_dict(cfg, sd, prefix=PREFIX)
    assert loaded.kv_b_proj.weight.dtype == F64                 # dtype taken from the checkpoint
    same_layer(loaded, layer, cfg)
    as32 = MLALayer.from_state_dict(cfg, sd, prefix=PREFIX, dtype=torch.float32)
    assert as32.o_proj.weight.dtype == torch.float32


def test_safetensors_round_trip_with_shards(tmp_path):
    cfg = cfg_for()
    layer = MLALayer.random(cfg, dtype=torch.float32, seed=2)
    sd = prefixed(layer)
    keys = sorted(sd)
    first, second = tmp_path / "model-00001.safetensors", tmp_path / "model-00002.safetensors"
    save_file({k: sd[k] for k in keys[:3]} | {"lm_head.weight": torch.zeros(2, 2)}, str(first))
    save_file({k: sd[k] for k in keys[3:]}, str(second))
    loaded = MLALayer.from_safetensors(cfg, [first, second], prefix=PREFIX)
    same_layer(loaded, layer, cfg)
    single = tmp_path / "attn.safetensors"
    save_file(layer.state_dict(), str(single))
    same_layer(MLALayer.from_safetensors(cfg, single), layer, cfg)
    with pytest.raises(ValueError, match="is in both"):
        MLALayer.from_safetensors(cfg, [first, first], prefix=PREFIX)
    with pytest.raises(ValueError, match=f"missing {keys[0]}"):          # a shard left out
        MLALayer.from_safetensors(cfg, [second], prefix=PREFIX)


def test_bad_weights_are_clear_errors():
    cfg = cfg_for()
    sd = prefixed(MLALayer.random(cfg, dtype=F64))
    missing = dict(sd)
    del missing[PREFIX + "kv_b_proj.weight"]
    shape = [cfg.h * 2 * cfg.d, cfg.k]
    with pytest.raises(ValueError, match=rf"missing {PREFIX}kv_b_proj.weight \(expected shape \[{shape[0]}, {shape[1]}\]\)"):
        MLALayer.from_state_dict(cfg, missing, prefix=PREFIX)
    extra = dict(sd, **{PREFIX + "q_proj.weight": torch.zeros(3, 4)})
    with pytest.raises(ValueError, match=rf"unexpected {PREFIX}q_proj.weight \(shape \[3, 4\]\)"):
        MLALayer.from_state_dict(cfg, extra, prefix=PREFIX)
    wrong = dict(sd, **{PREFIX + "o_proj.weight": torch.zeros(cfg.hidden, cfg.h * cfg.d + 1, dtype=F64)})
    with pytest.raises(ValueError, match=rf"{PREFIX}o_proj.weight: expected shape \[{cfg.hidden}, {cfg.h * cfg.d}\], "
                                         rf"got \[{cfg.hidden}, {cfg.h * cfg.d + 1}\]"):
        MLALayer.from_state_dict(cfg, wrong, prefix=PREFIX)
    with pytest.raises(ValueError, match="no tensor under prefix 'model.layers.9.'"):
        MLALayer.from_state_dict(cfg, sd, prefix="model.layers.9.")
    # the config decides the key set: a q_lora checkpoint loaded as a q_proj model is an error
    with pytest.raises(ValueError, match="missing .*q_proj.weight"):
        MLALayer.from_state_dict(cfg.replace(q_lora_rank=None), sd, prefix=PREFIX)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8")
def test_fp8_block_scales_are_dequantised():
    cfg = cfg_for()
    layer = MLALayer.random(cfg, dtype=torch.float32, seed=3)
    sd = layer.state_dict()
    weight = sd["kv_b_proj.weight"]                                # [h*2d, k] = [64, 64]: one partial block
    scale = torch.tensor([[0.5]])
    fp8 = (weight / scale).to(torch.float8_e4m3fn)
    quant = dict(sd, **{"kv_b_proj.weight": fp8, "kv_b_proj.weight_scale_inv": scale})
    loaded = MLALayer.from_state_dict(cfg, quant, dtype=torch.float32)
    torch.testing.assert_close(loaded.kv_b_proj.weight, fp8.float() * 0.5, rtol=0, atol=0)
    # blockwise: a 130 x 260 weight has 2 x 3 blocks of 128
    w = torch.randn(130, 260)
    scales = torch.rand(2, 3) + 0.5
    got = dequantize_fp8_blocks(w, scales)
    assert torch.equal(got[127, 255], w[127, 255] * scales[0, 1]) and torch.equal(got[129, 259], w[129, 259] * scales[1, 2])
    with pytest.raises(ValueError, match=r"weight_scale_inv must be \[2, 3\]"):
        dequantize_fp8_blocks(w, scales[:1])


def test_absorbed_weights_layout_and_caching():
    cfg = cfg_for()
    layer = MLALayer.random(cfg, dtype=F64, seed=4).requires_grad_(False)   # inference: views, made once
    w = layer.absorbed
    weight = layer.kv_b_proj.weight.detach()
    assert w.w_uk.shape == (cfg.h, cfg.d, cfg.k) and w.w_uv.shape == (cfg.h, cfg.k, cfg.d)
    assert w.w_uk.dtype == weight.dtype and w.w_uk.data_ptr() == weight.data_ptr()   # views: never stale
    dense = absorbed_weights(weight, cfg.h, cfg.d, cfg.dv)
    assert dense.w_uk.is_contiguous() and dense.w_uv.is_contiguous()
    assert torch.equal(dense.w_uk, w.w_uk) and torch.equal(dense.w_uv, w.w_uv)
    head = 2
    assert torch.equal(w.w_uk[head], weight[head * 2 * cfg.d: head * 2 * cfg.d + cfg.d])
    assert torch.equal(w.w_uv[head], weight[head * 2 * cfg.d + cfg.d: (head + 1) * 2 * cfg.d].T)
    z = torch.randn(1, 3, cfg.k, dtype=F64)
    k_nope, v = layer.expand(z)
    torch.testing.assert_close(k_nope, torch.einsum("hdk,btk->bthd", w.w_uk, z))
    torch.testing.assert_close(v, torch.einsum("btk,hkd->bthd", z, w.w_uv))
    assert layer.absorbed is w                                     # formed once
    before = w.w_uk.clone()
    with torch.no_grad():
        layer.kv_b_proj.weight.mul_(2)
    assert torch.equal(layer.absorbed.w_uk, 2 * before)
    layer.kv_b_proj.weight.data = layer.kv_b_proj.weight.data * 3         # a new tensor: new views
    assert layer.absorbed is not w and torch.equal(layer.absorbed.w_uk, 6 * before)
    views = absorbed_weights(layer.kv_b_proj.weight, cfg.h, cfg.d, cfg.dv, contiguous=False)
    assert views.w_uk.data_ptr() == layer.kv_b_proj.weight.data_ptr()
    with pytest.raises(ValueError, match=r"kv_b_proj.weight must be \[h\*\(d\+dv\)"):
        absorbed_weights(weight[:-1], cfg.h, cfg.d, cfg.dv)


# --- refused checkpoints: every cause names the key or the file ------------------------------------

FLOAT8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.mark.parametrize("fp8", FLOAT8, ids=str)
@pytest.mark.parametrize("key", ["kv_b_proj.weight", "q_b_proj.weight", "o_proj.weight"])
def test_fp8_weight_without_its_scales_is_refused(fp8, key):
    cfg = cfg_for()
    sd = prefixed(MLALayer.random(cfg, dtype=torch.float32))
    sd[PREFIX + key] = (sd[PREFIX + key] * 100).to(fp8)     # stored / scale: would load 100x too large
    with pytest.raises(ValueError, match=rf"{PREFIX}{key} is {fp8}.*{PREFIX}{key}_scale_inv is missing"):
        MLALayer.from_state_dict(cfg, sd, prefix=PREFIX)


@pytest.mark.parametrize("change,match", [
    (lambda w, s: (w.float(), s), "block scales belong to float8 weights only"),            # already dequantised
    (lambda w, s: (w, s.to(torch.int32)), "weight_scale_inv must hold float32/bf16 scales"),
    (lambda w, s: (w, s * float("nan")), "NaN or infinite scales"),
    (lambda w, s: (w, s.repeat(2, 1)), r"weight_scale_inv must be \[1, 1\]"),
])
def test_bad_fp8_scales_are_refused_by_key(change, match):
    cfg = cfg_for()
    sd = prefixed(MLALayer.random(cfg, dtype=torch.float32))
    weight, scale = change(sd[PREFIX + "kv_b_proj.weight"].to(torch.float8_e4m3fn), torch.tensor([[0.5]]))
    sd[PREFIX + "kv_b_proj.weight"], sd[PREFIX + "kv_b_proj.weight_scale_inv"] = weight, scale
    with pytest.raises(ValueError, match=match) as info:
        MLALayer.from_state_dict(cfg, sd, prefix=PREFIX)
    assert "kv_b_proj.weight" in str(info.value)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool, torch.complex64])
def test_non_floating_weights_are_refused(dtype):
    cfg = cfg_for()
    sd = prefixed(MLALayer.random(cfg, dtype=torch.float32))
    sd[PREFIX + "o_proj.weight"] = sd[PREFIX + "o_proj.weight"].to(dtype)
    with pytest.raises(ValueError, match=rf"{PREFIX}o_proj.weight has dtype {dtype}"):
        MLALayer.from_state_dict(cfg, sd, prefix=PREFIX)


def test_numpy_values_are_converted():
    cfg = cfg_for()
    layer = MLALayer.random(cfg, dtype=torch.float32, seed=5)
    as_numpy = {key: value.numpy() for key, value in prefixed(layer).items()}
    as_numpy[PREFIX + "o_proj.weight"] = as_numpy[PREFIX + "o_proj.weight"].T.copy().T      # not C-contiguous
    same_layer(MLALayer.from_state_dict(cfg, as_numpy, prefix=PREFIX), layer, cfg)


@pytest.mark.parametrize("value,match", [
    ([[1.0, 2.0]], "must be a torch.Tensor or a numpy array, got list"),
    (3.0, "got float"),
    (None, "got NoneType"),
    ("weights.bin", "got str"),
    (np.array([["a", "b"]]), "numeric array"),
    (np.float32(1.0), "numeric array"),
    (torch.empty(2, 2, device="meta"), "meta device"),
    (torch.eye(2).to_sparse(), "dense tensor"),
], ids=["list", "float", "None", "str", "numpy strings", "numpy scalar", "meta", "sparse"])
def test_other_values_are_refused_by_key(value, match):
    cfg = cfg_for()
    sd = prefixed(MLALayer.random(cfg, dtype=torch.float32))
    sd[PREFIX + "kv_a_layernorm.weight"] = value
    with pytest.raises(ValueError, match=rf"{PREFIX}kv_a_layernorm.weight.*{match}"):
        MLALayer.from_state_dict(cfg, sd, prefix=PREFIX)


@pytest.mark.parametrize("state_dict,match", [
    (None, "state_dict must be a mapping"),
    ([("a", torch.zeros(1))], "state_dict must be a mapping"),
    ({3: torch.zeros(1)}, "keys must be strings, got 3"),
])
def test_state_dict_itself_must_be_a_mapping_of_strings(state_dict, match):
    with pytest.raises(ValueError, match=match):
        MLALayer.from_state_dict(cfg_for(), state_dict)


def _safetensors_bytes(tmp_path):
    path = tmp_path / "good.safetensors"
    save_file({"a": torch.zeros(8, 8)}, str(path))
    return path.read_bytes()


@pytest.mark.parametrize("kind,make,match", [
    ("truncated", lambda good: good[:-10], "truncated"),
    ("header only", lambda good: good[:8], "truncated, or not a safetensors file"),
    ("too short", lambda good: good[:5], "has 5 bytes: too short"),
    ("empty", lambda good: b"", "is empty"),
    ("random bytes", lambda good: bytes(range(256)) * 4, "truncated, or not a safetensors file"),
    ("absurd header", lambda good: (2**62).to_bytes(8, "little") + b"{}", "announces a 4,611,686,018,427,387,904-byte"),
    ("header not JSON", lambda good: (5).to_bytes(8, "little") + b"xxxxx", "cannot be read: invalid JSON"),
])
def test_unreadable_safetensors_name_the_file(tmp_path, kind, make, match):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(make(_safetensors_bytes(tmp_path)))
    with pytest.raises(ValueError, match=match) as info:
        MLALayer.from_safetensors(cfg_for(), path)
    assert str(path) in str(info.value)


def test_safetensors_paths_that_are_not_files(tmp_path):
    cfg = cfg_for()
    with pytest.raises(ValueError, match=r"cannot read safetensors file .*nope.safetensors.*: no such file"):
        MLALayer.from_safetensors(cfg, tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match=rf"cannot read safetensors file '{tmp_path}': it is a directory"):
        MLALayer.from_safetensors(cfg, tmp_path)
    for paths, match in (([], "no files given"), (None, "a path or a list of paths"), ([None], "expected a path")):
        with pytest.raises(ValueError, match=match):
            MLALayer.from_safetensors(cfg, paths)


def test_absorbed_weights_are_detached_unless_asked():
    cfg = cfg_for()
    weight = torch.randn(cfg.h * 2 * cfg.d, cfg.k, dtype=F64, requires_grad=True)
    assert not absorbed_weights(weight, cfg.h, cfg.d, cfg.dv).w_uk.requires_grad
    live = absorbed_weights(weight, cfg.h, cfg.d, cfg.dv, detach=False)
    (live.w_uk.sum() + 2 * live.w_uv.sum()).backward()
    d = cfg.d
    expected = torch.ones_like(weight).view(cfg.h, 2 * d, cfg.k)
    expected[:, d:] = 2
    torch.testing.assert_close(weight.grad, expected.view_as(weight))
