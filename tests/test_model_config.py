"""MLAConfig.from_hf_config takes a config.json dict or a config object, and refuses every value
of the wrong type with a message naming the key (no truncation of 512.7 to 512, no
AttributeError for a string where an object belongs)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from mla_var3.model import MLAConfig, YarnScaling

from test_model_rope import DEEPSEEK_V3_HF


class PretrainedConfigLike:
    """What transformers hands out: attributes, some on the class (model_type), and to_dict()."""

    model_type = "deepseek_v3"

    def __init__(self, **values):
        for key, value in values.items():
            setattr(self, key, value)

    def to_dict(self):
        return dict(vars(self), model_type=self.model_type)


def test_config_objects_are_accepted():
    want = MLAConfig.from_hf_config(DEEPSEEK_V3_HF)
    values = {k: v for k, v in DEEPSEEK_V3_HF.items() if k != "model_type"}
    assert MLAConfig.from_hf_config(PretrainedConfigLike(**values)) == want
    assert MLAConfig.from_hf_config(types.SimpleNamespace(**DEEPSEEK_V3_HF)) == want


@pytest.mark.parametrize("config", [None, "config.json", 3, [("hidden_size", 7168)], b"{}"],
                         ids=["None", "str", "int", "list", "bytes"])
def test_things_that_are_not_configs(config):
    with pytest.raises(ValueError, match="config must be a config.json dict or a config object"):
        MLAConfig.from_hf_config(config)


def test_an_object_without_the_keys_names_them():
    with pytest.raises(ValueError, match=r"missing keys \['hidden_size'"):
        MLAConfig.from_hf_config(object())


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank",
                                 "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_hidden_layers"])
@pytest.mark.parametrize("value,words", [
    (512.7, "must be an integer, got 512.7"),
    ("abc", "must be an integer, got 'abc'"),
    ("512", "must be an integer, got '512'"),
    (True, "must be an integer, got True"),
    (float("nan"), "must be an integer"),
    (float("inf"), "must be an integer"),
    (-64, r"must be an integer in \[1, 2\*\*53\]"),
    (0, r"must be an integer in \[1, 2\*\*53\]"),
    (10**400, r"must be an integer in \[1, 2\*\*53\], got 1000"),
    ([64], "must be an integer"),
    (np.bool_(True), "must be an integer"),
], ids=["float", "word", "numeric string", "bool", "nan", "inf", "negative", "zero", "huge", "list", "numpy bool"])
def test_integer_keys_refuse_other_values_by_name(key, value, words):
    with pytest.raises(ValueError, match=rf"from_hf_config: {key} {words}"):
        MLAConfig.from_hf_config(dict(DEEPSEEK_V3_HF, **{key: value}))


@pytest.mark.parametrize("value", [512.0, np.int64(512), np.int32(512), np.float64(512.0)], ids=repr)
def test_integral_values_are_integers(value):
    """JSON may say 512.0; a config built in numpy holds numpy integers."""
    cfg = MLAConfig.from_hf_config(dict(DEEPSEEK_V3_HF, kv_lora_rank=value, rope_theta=np.float32(10000.0)))
    assert cfg.k == 512 and type(cfg.k) is int and type(cfg.rope_theta) is float


@pytest.mark.parametrize("key,value,words", [
    ("rope_theta", "10000", "rope_theta must be a number"),
    ("rope_theta", float("nan"), "rope_theta must be a finite positive number"),
    ("rope_theta", -1.0, "rope_theta must be a finite positive number"),
    ("rms_norm_eps", float("inf"), "rms_norm_eps must be a finite positive number"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps must be a number"),
    ("rope_interleave", "false", "rope_interleave must be true or false, got 'false'"),
    ("rope_interleave", 0, "rope_interleave must be true or false"),
    ("attention_bias", "no", "attention_bias must be true or false"),
    ("rope_scaling", "yarn", "rope_scaling must be an object \\(or null\\), got 'yarn'"),
    ("rope_scaling", ["yarn"], "rope_scaling must be an object"),
    ("rope_parameters", "yarn", "rope_parameters must be an object"),
])
def test_other_keys_refuse_wrong_types_by_name(key, value, words):
    with pytest.raises(ValueError, match=words):
        MLAConfig.from_hf_config(dict(DEEPSEEK_V3_HF, **{key: value}))


@pytest.mark.parametrize("key,value,words", [
    ("factor", "40", "factor must be a number"),
    ("factor", float("inf"), "factor must be a finite positive number"),
    ("factor", -2.0, "factor must be a finite positive number"),
    ("original_max_position_embeddings", 4096.5, "original_max_position_embeddings must be an integer"),
    ("beta_fast", float("nan"), "beta_fast must be a finite number"),
    ("mscale", "1", "mscale must be a number"),
    ("attention_factor", 0.0, "attention_factor must be a finite positive number"),
    ("truncate", "yes", "truncate must be true or false"),
    ("type", 3, "unsupported rope type 3"),
])
def test_yarn_block_refuses_wrong_types_by_name(key, value, words):
    rope = dict(DEEPSEEK_V3_HF["rope_scaling"], **{key: value})
    with pytest.raises(ValueError, match=words):
        MLAConfig.from_hf_config(dict(DEEPSEEK_V3_HF, rope_scaling=rope))


def test_yarn_factor_from_context_lengths_checks_them():
    rope = {k: v for k, v in DEEPSEEK_V3_HF["rope_scaling"].items() if k != "factor"}
    with pytest.raises(ValueError, match="max_position_embeddings must be an integer"):
        MLAConfig.from_hf_config(dict(DEEPSEEK_V3_HF, rope_scaling=rope, max_position_embeddings="163840"))


@pytest.mark.parametrize("field,value", [("rope_theta", math.nan), ("rms_norm_eps", -1.0), ("rms_norm_eps", "1e-6"),
                                         ("rope_interleave", "true"), ("attention_bias", 1),
                                         ("rope_scaling", {"type": "yarn"}), ("q_lora_rank", True),
                                         ("hybrid_n", True), ("name", None)])
def test_mla_config_checks_every_field(field, value):
    with pytest.raises(ValueError, match=f"MLAConfig: {field}"):
        MLAConfig.from_preset("deepseek-v3").replace(**{field: value})


@pytest.mark.parametrize("field,value", [("factor", math.inf), ("factor", 0.0), ("beta_fast", math.nan),
                                         ("original_max_position_embeddings", 1.5), ("truncate", "yes")])
def test_yarn_scaling_checks_every_field(field, value):
    kwargs = {"factor": 40.0, "original_max_position_embeddings": 4096, field: value}
    with pytest.raises(ValueError, match=f"YarnScaling: {field}"):
        YarnScaling(**kwargs)


def test_scaled_refuses_a_bool_divisor():
    with pytest.raises(ValueError, match="div must be a positive integer, got True"):
        MLAConfig.from_preset("deepseek-v3").scaled(div=True)
