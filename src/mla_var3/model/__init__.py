"""The MLA attention layer with HF DeepSeek-V2/V3 weights, RoPE/YaRN, weight absorption, the
KV-cache containers of the three designs, and the one path that runs a design over a cache
(:func:`run_design`; :func:`mla_attention` decides the design first).

>>> from mla_var3.model import MLAConfig, MLALayer                       # doctest: +SKIP
>>> cfg = MLAConfig.from_hf_config(config_dict)
>>> layer = MLALayer.from_safetensors(cfg, paths, prefix="model.layers.3.self_attn.")
>>> out, cache = layer(hidden_states, positions, cache=None, mode="absorbed")
>>> out, cache = layer(next_hidden, next_positions, cache=cache, mode="absorbed")
"""

from mla_var3.model.attention import AttentionState, default_dispatcher, mla_attention, run_design
from mla_var3.model.backend import attention_fn
from mla_var3.model.cache import ExpandedCache, LatentCache, PagedLatentCache
from mla_var3.model.config import MLAConfig, YarnScaling, yarn_get_mscale
from mla_var3.model.expand import expand_kv
from mla_var3.model.hybrid_cache import HybridCache
from mla_var3.model.layer import MODES, MLALayer, RMSNorm
from mla_var3.model.rope import apply_rope, rope_cos_sin, rope_inv_freq
from mla_var3.model.weights import AbsorbedWeights, absorbed_weights

__all__ = [
    "MLAConfig", "YarnScaling", "yarn_get_mscale", "MLALayer", "RMSNorm", "MODES",
    "LatentCache", "ExpandedCache", "HybridCache", "PagedLatentCache",
    "AbsorbedWeights", "absorbed_weights", "apply_rope", "rope_cos_sin", "rope_inv_freq", "attention_fn",
    "AttentionState", "default_dispatcher", "expand_kv", "mla_attention", "run_design",
]
