"""Run a Hugging Face transformers model's MLA attention on mla_var3.

>>> from mla_var3.integrations.transformers import enable, disable        # doctest: +SKIP
>>> model = enable(AutoModelForCausalLM.from_pretrained(...))   # in place; returns the model
>>> out = model.generate(**tokenizer(prompts, return_tensors="pt", padding=True), max_new_tokens=64)
>>> model = disable(model)                                      # the original modules are back

:func:`enable` replaces every MLA attention module of the model by an :class:`MLAAttention`:
it holds an :class:`~mla_var3.model.MLALayer` whose projections and norms **are** the original
module's submodules (no copy: same parameters, same dtype and device) and runs
``MLALayer.forward`` (``mode``: ``"auto"`` lets the dispatcher pick the design per call, or a
fixed ``"absorbed"``, ``"naive"``, ``"hybrid"``) over a latent cache kept in an
:class:`~mla_var3.integrations.hf_cache.MLACache`, a transformers ``Cache`` (``paged=True``:
FlashMLA's paged layout). ``generate`` (greedy, sampling, beam search, left-padded batches)
and plain forwards, with or without a cache, work as with the stock model.

Detection (not by class name): a module is MLA attention when it has the MLA projections
(``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``, and ``q_proj`` or
``q_a_proj`` + ``q_a_layernorm`` + ``q_b_proj``), its config (its own ``config``, else the
model's text config) has the MLA fields (``kv_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``, ...), and the weights have the shapes that config gives.
A module with the names but other shapes, quantized (float8) weights, an unsupported RoPE
type, or a softmax scale other than the config's, is a ValueError naming the module; a model with no MLA attention is a
ValueError saying so.

Padding. transformers feeds left-padded batches whole and masks the pad keys. Here padding never
enters the cache: the attention reads which new tokens are real from the last row of the mask
transformers passes (every real key is visible to the last query under a causal mask; a 2D mask
for flash attention, nothing when nothing is padded), packs each sequence's real tokens to the
front, runs the layer once (the cache appends them after each sequence's own tokens: ragged
``seqlens``), keeps only the real tokens in the cache (:func:`~mla_var3.integrations.hf_cache.keep_first`)
and puts the outputs back at their places. RoPE positions are transformers' ``position_ids``
(``generate`` numbers the real tokens 0, 1, ...), so each real token sees the same keys at the
same positions as in the stock model. A padded position's output is the attention of nothing,
``o_proj(0)``: what PyTorch's SDPA gives a row with no visible key (transformers' eager
attention gives such a row the mean of the masked values instead; only the padded positions'
outputs differ then). That holds for left padding, where a pad query sees no key. With *right*
padding a pad query at the end of a prompt sees the real keys before it in the stock model and
gets their attention; here it gets ``o_proj(0)``: the real tokens' outputs, the cache and every
generated token are the same, the pad positions' hidden states (and logits) differ
(transformers advises left padding for generation). Without padding the layer runs directly on
the batch (no mask read, no copy); over a paged cache the mask is read on the device, never on
the host, so a decode step can be captured in a CUDA graph. An ``MLACache`` made by the caller
keeps its own ``paged`` choice.

Not supported while enabled: ``StaticCache`` / ``cache_implementation="static"`` (its masks are
built for its fixed length; use the default cache), flex attention's block masks (use
``attn_implementation="sdpa"`` or ``"eager"``), ``output_attentions`` (no attention weights are
formed; none are returned).
"""

from __future__ import annotations

import inspect
import weakref

import torch
from torch import nn

try:
    from transformers.cache_utils import Cache, StaticCache
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("mla_var3.integrations.transformers needs transformers >= 5: "
                      "pip install 'mla_var3[hf]'") from exc

from mla_var3.integrations.hf_cache import MLACache, keep_first, with_room
from mla_var3.model import MODES, MLAConfig, MLALayer, PagedLatentCache
from mla_var3.model import AttentionState

#: the MLA projections and norms (HF DeepSeek names) an MLA attention module has.
KV_PATH = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")
Q_PATHS = (("q_a_proj", "q_a_layernorm", "q_b_proj"), ("q_proj",))
#: the config fields that make a config an MLA one.
CONFIG_FIELDS = ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim")
ENABLE_MODES = (*MODES, "auto")
_PAGED_MODES = ("auto", "absorbed")      # the modes that run over a paged latent cache
_HOOKS = "_mla_var3_hooks"
_FLOAT_WEIGHTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --------------------------------------------------------------------------------- detection


def _submodule(module: nn.Module, name: str) -> nn.Module | None:
    child = getattr(module, name, None)
    return child if isinstance(child, nn.Module) else None


def _q_path(module: nn.Module) -> tuple[str, ...] | None:
    return next((path for path in Q_PATHS if all(_submodule(module, n) is not None for n in path)), None)


def _weight_shape(module: nn.Module, name: str) -> tuple[int, ...] | None:
    weight = getattr(_submodule(module, name), "weight", None)
    return tuple(weight.shape) if isinstance(weight, torch.Tensor) else None


def _text_config(model: nn.Module):
    config = getattr(model, "config", None)
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else config


def mla_config(module: nn.Module, model_config=None) -> MLAConfig | None:
    """The :class:`MLAConfig` of ``module`` when it is MLA attention (see the module docstring),
    else None. ValueError for a module with the MLA names that cannot run here as it is."""
    if any(_submodule(module, n) is None for n in KV_PATH) or _q_path(module) is None:
        return None
    own = getattr(module, "config", None)
    config = own if own is not None and all(getattr(own, f, None) is not None for f in CONFIG_FIELDS) \
        else model_config
    if config is None or any(getattr(config, f, None) is None for f in CONFIG_FIELDS):
        return None
    cfg = MLAConfig.from_hf_config(config)
    c = cfg
    want = {"kv_a_proj_with_mqa": (c.k + c.p, c.hidden), "kv_b_proj": (c.h * (c.d + c.dv), c.k),
            "o_proj": (c.hidden, c.h * c.dv)}
    if c.q_lora_rank is not None and _q_path(module) == Q_PATHS[0]:
        want.update(q_a_proj=(c.q_lora_rank, c.hidden), q_b_proj=(c.h * c.qk_head_dim, c.q_lora_rank))
    elif c.q_lora_rank is None and _q_path(module) == Q_PATHS[1]:
        want.update(q_proj=(c.h * c.qk_head_dim, c.hidden))
    else:
        raise ValueError(f"{type(module).__name__}: q_lora_rank={c.q_lora_rank} but the module's query path "
                         f"is {'/'.join(_q_path(module))}")
    wrong = {n: (_weight_shape(module, n), shape) for n, shape in want.items() if _weight_shape(module, n) != shape}
    if wrong:
        listed = ", ".join(f"{n} {list(got) if got else None} (config: {list(exp)})" for n, (got, exp) in wrong.items())
        raise ValueError(f"{type(module).__name__} has MLA weights whose shapes do not match its config: {listed}")
    odd = {n: w.dtype for n in want if (w := getattr(_submodule(module, n), "weight", None)) is not None
           and w.dtype not in _FLOAT_WEIGHTS}
    if odd:
        listed = ", ".join(f"{n}.weight is {dtype}" for n, dtype in odd.items())
        raise ValueError(f"{type(module).__name__}: {listed}; the layer runs float16/bfloat16/float32/float64 "
                         "weights (dequantize a quantized checkpoint first)")
    scaling = getattr(module, "scaling", None)
    if isinstance(scaling, float) and abs(scaling - c.softmax_scale) > 1e-6 * c.softmax_scale:
        raise ValueError(f"{type(module).__name__} scales scores by {scaling}, the config gives {c.softmax_scale}")
    return cfg


def _mla_modules(model: nn.Module) -> list[tuple[str, nn.Module, MLAConfig]]:
    """(qualified name, module, config) of every MLA attention module, outermost first."""
    found, inside = [], []
    model_config = _text_config(model)
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        try:
            cfg = mla_config(module, model_config)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        if cfg is not None:
            found.append((name, module, cfg))
            inside.append(name)
    _check_one_place_each(model, found)
    return found


def _check_one_place_each(model: nn.Module, found: list[tuple[str, nn.Module, MLAConfig]]) -> None:
    """Refuse an MLA attention module reachable under two names (one module shared by two layers:
    ``named_modules()`` lists it once, so only its first place would be replaced) and two modules
    with one ``layer_idx`` (both would read and write one cache slot). Either way the layers'
    caches would mix; the stock model's cache mixes them too."""
    places: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        places.setdefault(id(module), []).append(name)
    for name, module, _ in found:
        names = places.get(id(module), [name])
        if len(names) > 1:
            raise ValueError(f"{names[0]} and {names[1]} are one {type(module).__name__} module shared by two layers: "
                             "each attention layer keeps its own cache (by layer_idx), so mla_var3 cannot run a shared "
                             "one; give each layer its own module (copy.deepcopy) before enable()")
    seen: dict[int, str] = {}
    for order, (name, module, _) in enumerate(found):
        idx = _layer_idx(module, order)
        if idx in seen:
            raise ValueError(f"{seen[idx]} and {name} both have layer_idx={idx}: their caches would be one; give "
                             "each attention module its own layer_idx before enable()")
        seen[idx] = name


def _layer_idx(module: nn.Module, order: int) -> int:
    """The cache slot of an MLA attention module: its ``layer_idx``, else its place in the model."""
    idx = getattr(module, "layer_idx", None)
    return idx if isinstance(idx, int) and not isinstance(idx, bool) else order


# ----------------------------------------------------------------------------------- adapter


def _valid_tokens(mask, b: int, q: int, *, sync: bool = True) -> torch.Tensor | None:
    """``[B, Q]`` bool: which of the q new tokens are real, from the mask transformers gives
    attention (None: all of them). A 4D mask's last query row sees every real key of a causal
    batch; its last q columns are the new tokens (``MLACacheLayer.get_mask_sizes``). ``sync``:
    return None when every token is real (a host synchronisation); without, the tensor as it is
    (a paged cache attends without reading it on the host: CUDA-graph capturable)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mla_var3 attention reads boolean, float or 2D attention masks, got a {type(mask).__name__} "
                         "(flex attention?): load the model with attn_implementation='sdpa' or 'eager'")
    if mask.dim() == 2:                                 # flash attention: the 2D padding mask itself
        last = mask[:, -q:]
    elif mask.dim() == 4:
        last = mask[:, 0, -1, -q:]
    else:
        raise ValueError(f"attention mask must be 2D or 4D, got {list(mask.shape)}")
    valid = last if last.dtype == torch.bool else (last > torch.finfo(last.dtype).min / 2 if
                                                   last.is_floating_point() else last != 0)
    valid = valid.expand(b, q)
    if not sync:
        return valid
    return None if bool(valid.all()) else valid


class MLAAttention(nn.Module):
    """Stands in for one MLA attention module: its weights, run by :attr:`mla` (an ``MLALayer``).

    The original module is kept (not as a submodule: its parameters are ``mla``'s) for
    :func:`disable`. ``state_dict`` keys are the original module's (``q_a_proj.weight``, ...).
    """

    def __init__(self, original: nn.Module, cfg: MLAConfig, layer_idx: int, mode: str, paged: bool):
        super().__init__()
        weight = original.kv_b_proj.weight
        layer = MLALayer(cfg, dtype=weight.dtype, device="meta")
        for name in (*KV_PATH, *_q_path(original)):
            setattr(layer, name, getattr(original, name))            # the same modules: no copy
        self.mla = layer
        self.layer_idx, self.mode, self.paged = layer_idx, mode, paged
        self.config = getattr(original, "config", None)
        self.is_causal = True
        object.__setattr__(self, "_original", original)
        self.register_state_dict_post_hook(_state_dict_keys)
        self.register_load_state_dict_pre_hook(_load_keys)

    @property
    def original(self) -> nn.Module:
        return self._original

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}, mode={self.mode!r}, paged={self.paged}"

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, cache=None,
                past_key_values=None, position_ids=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, MLACache):
            raise ValueError(f"mla_var3 attention keeps its cache in an MLACache, got a {type(cache).__name__}")
        b, q = hidden_states.shape[:2]
        slot = cache.layer(self.layer_idx) if cache is not None else None
        state = slot.state if slot is not None else None
        paged = cache.paged if cache is not None else self.paged
        valid = self._valid(attention_mask, cache, b, q, sync=not paged)
        if position_ids is None:                       # transformers' default: the fed tokens, counted
            position_ids = torch.arange(q, device=hidden_states.device) + (slot.seen if slot is not None else 0)
        positions = position_ids.reshape(-1, q).expand(b, q).long()
        out, state = self._attend(hidden_states, positions, valid, state, paged)
        if slot is not None:
            slot.state, slot.seen, slot.owner = state, slot.seen + q, self.mla
        return out, None

    def _valid(self, mask, cache, b: int, q: int, sync: bool):
        if cache is None:
            return _valid_tokens(mask, b, q, sync=sync)
        memo = cache._mask_memo
        if memo is None or memo[0] is not mask:      # one read per step, shared by the layers
            cache._mask_memo = memo = (mask, _valid_tokens(mask, b, q, sync=sync))
        return memo[1]

    def _start(self, state, b: int, s: int, like: torch.Tensor, paged: bool):
        """The cache to append s tokens to: a new paged one when the cache is paged, and a paged
        one with room for them (None lets the layer start the mode's own)."""
        if not paged:
            return state
        c = self.mla.cfg
        if state is None:
            state = PagedLatentCache.empty(b, c.k, c.p, dtype=like.dtype, device=like.device)
        return with_room(state, s)

    def _attend(self, x: torch.Tensor, positions: torch.Tensor, valid, state, paged: bool):
        """The layer over the real tokens of ``x [B, Q, hidden]`` (``valid [B, Q]``, None: all):
        the real tokens of each row first, in order, appended and attended; padding gets
        ``_nothing``. A paged cache attends all Q packed tokens and keeps the real ones
        (:func:`keep_first` trims the lengths on the device: no host synchronisation; a real
        token ``i`` still sees exactly the keys before it, as the causal rule counts from the
        end); the other caches attend the most real tokens of a row (a host read)."""
        b, q = x.shape[:2]
        if valid is None:                                          # nothing padded: the layer as it is
            return self.mla(x, positions, cache=self._start(state, b, q, x, paged), mode=self.mode)
        counts = valid.sum(1)
        s = q if paged else int(counts.max())
        if s == 0:                                                 # only padding in this step
            return self._nothing(x), state
        before = state.seqlens.long() if state is not None else torch.zeros(b, dtype=torch.long, device=x.device)
        if q == 1:                                                 # one token: packing is the identity
            packed, packed_positions = x, positions
        else:
            order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :s]   # real tokens first, in order
            packed, packed_positions = x.gather(1, order[..., None].expand(b, s, x.shape[2])), positions.gather(1, order)
        out, state = self.mla(packed, packed_positions, cache=self._start(state, b, s, x, paged), mode=self.mode)
        state = keep_first(state, before.to(state.seqlens.device) + counts.to(state.seqlens.device), self.mla)
        if q > 1:
            rank = (valid.long().cumsum(1) - 1).clamp(min=0)                           # token -> packed slot
            out = out.gather(1, rank[..., None].expand(b, q, out.shape[2]))
        return torch.where(valid[..., None], out, self._nothing(x)), state

    def _nothing(self, x: torch.Tensor) -> torch.Tensor:
        """The output of a token that attends to nothing: ``o_proj`` of a zero attention output."""
        c = self.mla.cfg
        return self.mla.o_proj(x.new_zeros(1, 1, c.h * c.dv)).expand(*x.shape[:2], -1)


def _state_dict_keys(module, state_dict, prefix, local_metadata) -> None:
    """``<prefix>mla.<name>`` -> ``<prefix><name>``: the keys of the module it replaced."""
    inner = prefix + "mla."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)


def _load_keys(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "mla.")]:
        state_dict[prefix + "mla." + key[len(prefix):]] = state_dict.pop(key)


# ------------------------------------------------------------------------------ the cache hook


def _cache_name(module: nn.Module) -> str | None:
    """The name a forward takes its cache by (transformers 5 renames past_key_values to cache)."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    if "use_cache" not in params:
        return None
    return next((name for name in ("cache", "past_key_values") if name in params), None)


class _CacheHook:
    """A forward pre-hook on the modules that take the model's cache: an empty cache of another
    kind (``generate`` makes a DynamicCache) or none with ``use_cache`` becomes an MLACache. A
    user's empty cache is mapped to the same MLACache on every call, so passing it again goes on
    where it stopped."""

    def __init__(self, name: str, paged: bool):
        self.name, self.paged = name, paged
        self.stand_ins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, module, args, kwargs):
        key = "past_key_values" if kwargs.get("past_key_values") is not None else self.name
        cache = kwargs.get(key)
        if isinstance(cache, MLACache):
            return None
        if cache is None:
            use_cache = kwargs.get("use_cache")
            if use_cache is None:
                use_cache = getattr(getattr(module, "config", None), "use_cache", False)
            if not use_cache or (module.training and getattr(module, "gradient_checkpointing", False)):
                return None
            kwargs[key] = MLACache(paged=self.paged)
            return args, kwargs
        if not isinstance(cache, Cache):
            raise ValueError(f"mla_var3 attention keeps its cache in an MLACache, got a {type(cache).__name__}")
        if isinstance(cache, StaticCache) or cache.is_compileable:
            raise ValueError(f"a {type(cache).__name__} (cache_implementation='static') is not supported while mla_var3 "
                             "is enabled: use the default cache (an MLACache, paged with enable(..., paged=True))")
        if cache.get_seq_length() != 0:
            raise ValueError(f"this {type(cache).__name__} already holds keys and values of the stock attention; "
                             "pass a fresh cache, or an MLACache")
        if cache not in self.stand_ins:
            self.stand_ins[cache] = MLACache(paged=self.paged)
        kwargs[key] = self.stand_ins[cache]
        return args, kwargs


# ---------------------------------------------------------------------------------- the API


def enable(model: nn.Module, *, mode: str = "auto", paged: bool = False) -> nn.Module:
    """Run ``model``'s MLA attention on mla_var3, in place; returns ``model``.

    Parameters
    ----------
    model : a transformers model (``DeepseekV3ForCausalLM``, ``DeepseekV2ForCausalLM``, or any
        model whose attention has the MLA weights and config fields; see the module docstring)
    mode : "auto" (the dispatcher picks the design per call), "absorbed", "naive" or "hybrid"
        (:class:`~mla_var3.model.MLALayer` modes)
    paged : keep the latent cache paged (FlashMLA's layout); modes "auto" and "absorbed"

    Raises ValueError when the model has no MLA attention, is enabled already, or a module
    cannot run here as it is (the message names it).
    """
    if mode not in ENABLE_MODES:
        raise ValueError(f"mode must be one of {ENABLE_MODES}, got {mode!r}")
    if paged and mode not in _PAGED_MODES:
        raise ValueError(f"paged=True keeps a paged latent cache, which modes {_PAGED_MODES} read; mode {mode!r} "
                         "keeps its own")
    if getattr(model, _HOOKS, None) is not None or any(isinstance(m, MLAAttention) for m in model.modules()):
        raise ValueError("mla_var3 is enabled on this model already (disable it first to change mode or paging)")
    found = _mla_modules(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no MLA attention: no module has the MLA projections "
                         f"({', '.join(KV_PATH)} and a query projection) with a config giving "
                         f"{', '.join(CONFIG_FIELDS[2:])}")
    modules = dict(model.named_modules())
    state = AttentionState()        # one dispatcher (its decisions) and decode state for the model's layers
    for order, (name, module, cfg) in enumerate(found):
        adapter = MLAAttention(module, cfg, _layer_idx(module, order), mode, paged)
        adapter.mla.attention_state = state
        parent, _, attr = name.rpartition(".")
        setattr(modules[parent] if parent else model, attr, adapter)
    hooks = []
    ancestors = {name.rpartition(".")[0] for name, _, _ in found}
    ancestors |= {a.rsplit(".", i)[0] for a in ancestors for i in range(a.count(".") + 1)} | {""}
    for owner in [modules[a] for a in sorted(ancestors, key=len) if a in modules]:
        name = _cache_name(owner)
        if name is not None:
            hooks.append(owner.register_forward_pre_hook(_CacheHook(name, paged), with_kwargs=True))
    object.__setattr__(model, _HOOKS, hooks)
    return model


def disable(model: nn.Module) -> nn.Module:
    """Put back the original attention modules :func:`enable` replaced (in place; a model that
    is not enabled is returned as it is)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, MLAAttention):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, module.original)
    for hook in getattr(model, _HOOKS, None) or ():
        hook.remove()
    if _HOOKS in model.__dict__:
        object.__delattr__(model, _HOOKS)
    return model


def is_enabled(model: nn.Module) -> bool:
    return any(isinstance(m, MLAAttention) for m in model.modules())


__all__ = ["MLAAttention", "MLACache", "disable", "enable", "is_enabled", "mla_config"]
