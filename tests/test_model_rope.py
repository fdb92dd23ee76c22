"""RoPE/YaRN and the config: DeepSeek-V3's numbers worked out by hand, the interleaved-pair
convention against the complex-pair form of DeepSeek's own code, and config parsing."""

from __future__ import annotations

import math

import pytest
import torch

from mla_var3.model import MLAConfig, YarnScaling, apply_rope, rope_cos_sin, rope_inv_freq, yarn_get_mscale
from mla_var3.shapes import get_preset, preset_names

F64 = torch.float64

# The attention block of the public DeepSeek-V3 config.json.
DEEPSEEK_V3_HF = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "num_hidden_layers": 61,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "rope_theta": 10000, "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "attention_bias": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}


def test_deepseek_v3_yarn_by_hand():
    """Correction dims: 64 ln(4096 / (2 pi 32)) / (2 ln 1e4) = 10.47 -> 10 and
    64 ln(4096 / (2 pi)) / (2 ln 1e4) = 22.5 -> 23: frequencies 0..10 keep base^(-2i/64),
    23..31 are divided by 40, between them a linear ramp."""
    cfg = MLAConfig.from_preset("deepseek-v3")
    inv_freq, factor = rope_inv_freq(cfg)
    i = torch.arange(32, dtype=F64)
    base = 10000.0 ** (-2 * i / 64)
    assert inv_freq.shape == (32,)
    torch.testing.assert_close(inv_freq[:11], base[:11], rtol=1e-15, atol=0)
    torch.testing.assert_close(inv_freq[23:], base[23:] / 40, rtol=1e-15, atol=0)
    ramp = (i[15] - 10) / 13
    assert inv_freq[15].item() == pytest.approx(base[15].item() / 40 * ramp.item() + base[15].item() * (1 - ramp.item()), rel=1e-14)
    assert factor == 1.0                               # mscale == mscale_all_dim: cos/sin unscaled
    mscale = 0.1 * math.log(40) + 1
    assert cfg.softmax_scale == pytest.approx(192 ** -0.5 * mscale ** 2, rel=1e-15)
    assert round(cfg.softmax_scale, 5) == 0.13523


def test_mscale_rules():
    assert yarn_get_mscale(1.0, 5.0) == 1.0
    assert yarn_get_mscale(40, 0.707) == pytest.approx(0.0707 * math.log(40) + 1)
    lite = YarnScaling(factor=40, original_max_position_embeddings=4096, mscale=0.707, mscale_all_dim=0.707)
    assert lite.cos_sin_factor == 1.0 and lite.softmax_factor == pytest.approx(yarn_get_mscale(40, 0.707) ** 2)
    no_all = YarnScaling(factor=40, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=0.0)
    assert no_all.cos_sin_factor == pytest.approx(yarn_get_mscale(40)) and no_all.softmax_factor == 1.0
    explicit = YarnScaling(factor=4, original_max_position_embeddings=4096, attention_factor=0.5)
    assert explicit.cos_sin_factor == 0.5
    plain = MLAConfig.from_preset("deepseek-v3", rope_scaling=None)
    assert plain.softmax_scale == 192 ** -0.5
    torch.testing.assert_close(rope_inv_freq(plain)[0], 10000.0 ** (-torch.arange(0, 64, 2, dtype=F64) / 64))


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("yarn_factor", [None, 8.0])
def test_rotation_matches_complex_pairs(interleave, yarn_factor):
    """DeepSeek's code rotates ``view_as_complex(x.view(..., p/2, 2)) * exp(i pos f)``; the HF
    interleave form gives the same numbers with real parts first, then imaginary parts."""
    scaling = None if yarn_factor is None else YarnScaling(factor=yarn_factor, original_max_position_embeddings=64,
                                                            mscale=1.0, mscale_all_dim=0.5)
    cfg = MLAConfig(hidden=32, h=2, d=8, p=16, k=32, dv=8, rope_scaling=scaling, rope_interleave=interleave)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 16, generator=gen, dtype=F64)           # [B, H, S, p]
    positions = torch.randint(0, 5000, (2, 5), generator=gen)
    cos, sin = rope_cos_sin(cfg, positions, F64)
    got = apply_rope(x, cos[:, None], sin[:, None], interleave)
    inv_freq, factor = rope_inv_freq(cfg)
    rot = torch.polar(torch.full((2, 1, 5, 8), factor, dtype=F64), positions[:, None, :, None].double() * inv_freq)
    pairs = torch.view_as_complex(x.view(2, 3, 5, 8, 2)) if interleave else torch.complex(x[..., :8], x[..., 8:])
    want = pairs * rot
    torch.testing.assert_close(got, torch.cat((want.real, want.imag), dim=-1), rtol=1e-12, atol=1e-12)


def test_scores_depend_on_relative_position():
    cfg = MLAConfig.from_preset("deepseek-v3").scaled(div=4)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, cfg.p, generator=gen, dtype=F64)

    def score(m, n):
        cos, sin = rope_cos_sin(cfg, torch.tensor([[m, n]]), F64)
        return (apply_rope(q, cos[0, 0], sin[0, 0]) * apply_rope(k, cos[0, 1], sin[0, 1])).sum()

    assert score(7, 3).item() == pytest.approx(score(1007, 1003).item(), rel=1e-9)
    assert score(7, 3).item() != pytest.approx(score(7, 4).item(), rel=1e-3)


def test_low_precision_rotates_in_float32():
    cfg = MLAConfig.from_preset("deepseek-v3").scaled(div=4)
    cos, sin = rope_cos_sin(cfg, torch.arange(4)[None], torch.bfloat16)
    assert cos.dtype == sin.dtype == torch.float32
    x = torch.randn(1, 4, cfg.p).to(torch.bfloat16)
    assert apply_rope(x, cos, sin).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="integer"):
        rope_cos_sin(cfg, torch.zeros(1, 4), torch.float32)


def test_from_hf_config_deepseek_v3():
    cfg = MLAConfig.from_hf_config(DEEPSEEK_V3_HF)
    preset = MLAConfig.from_preset("deepseek-v3")
    assert cfg.replace(name="x") == preset.replace(name="x")
    assert cfg.dims.replace(name="x") == get_preset("deepseek-v3").replace(name="x")
    assert cfg.rope_interleave is True and cfg.rope_scaling.beta_fast == 32


def test_from_hf_config_rope_parameters_and_lite():
    v5 = dict(DEEPSEEK_V3_HF)
    params = dict(v5.pop("rope_scaling"), rope_type="yarn", rope_theta=10000)
    params.pop("type")
    v5.pop("rope_theta")
    v5["rope_parameters"] = params
    assert MLAConfig.from_hf_config(v5) == MLAConfig.from_hf_config(DEEPSEEK_V3_HF)
    lite = dict(DEEPSEEK_V3_HF, q_lora_rank=None, num_attention_heads=16, hidden_size=2048, rope_interleave=False,
                rope_scaling=None, attention_bias=True)
    cfg = MLAConfig.from_hf_config(lite)
    assert cfg.q_lora_rank is None and cfg.rope_scaling is None and cfg.attention_bias and not cfg.rope_interleave
    assert cfg.softmax_scale == 192 ** -0.5
    by_ratio = dict(DEEPSEEK_V3_HF, rope_scaling={k: v for k, v in DEEPSEEK_V3_HF["rope_scaling"].items() if k != "factor"})
    assert MLAConfig.from_hf_config(by_ratio).rope_scaling.factor == 40.0


def test_value_head_dim_may_differ():
    """A valid checkpoint config is never refused: v_head_dim != qk_nope_head_dim loads as it is."""
    cfg = MLAConfig.from_hf_config(dict(DEEPSEEK_V3_HF, v_head_dim=96))
    assert (cfg.d, cfg.dv, cfg.dims.dv) == (128, 96, 96)
    assert cfg.softmax_scale == 192 ** -0.5 * cfg.rope_scaling.softmax_factor   # q/k width d + p only
    assert MLAConfig(hidden=8, h=1, d=4, p=4, k=4, dv=8).dv == 8


def test_config_errors():
    with pytest.raises(ValueError, match=r"missing keys \['kv_lora_rank'\]"):
        MLAConfig.from_hf_config({k: v for k, v in DEEPSEEK_V3_HF.items() if k != "kv_lora_rank"})
    with pytest.raises(ValueError, match="unsupported rope type 'longrope'"):
        MLAConfig.from_hf_config(dict(DEEPSEEK_V3_HF, rope_scaling={"type": "longrope"}))
    with pytest.raises(ValueError, match="p must be even"):
        MLAConfig(hidden=8, h=1, d=4, p=3, k=4, dv=4)
    with pytest.raises(ValueError, match="h must be a positive integer"):
        MLAConfig(hidden=8, h=0, d=4, p=4, k=4, dv=4)


@pytest.mark.parametrize("preset", preset_names())
def test_scaled_keeps_ratios(preset):
    cfg = MLAConfig.from_preset(preset)
    small = cfg.scaled(div=8, h=4)
    assert small.k * cfg.d == cfg.k * small.d and small.p % 2 == 0 and small.h == 4
    assert small.rope_scaling == cfg.rope_scaling and small.rope_interleave == cfg.rope_interleave
    assert (small.q_lora_rank is None) == (cfg.q_lora_rank is None)
