"""Decoder configuration: one dataclass for the LLaMA-2/3, Qwen2 and Mistral families.

``ModelConfig.from_hf`` reads a HF ``config.json`` dict and refuses what the decoder cannot run
exactly (unknown ``model_type``, unsupported ``rope_scaling`` types) instead of approximating it.
"""
from __future__ import annotations

import dataclasses
import numbers
import json
from typing import Any, Optional

import jax.numpy as jnp

from longjax.errors import LongjaxError

FAMILIES = ("llama", "qwen2", "mistral")
REMAT_MODES = (False, True, "dots")  # see ModelConfig.remat
ROPE_TYPES = ("default", "linear", "dynamic", "llama3")
ALT_PROJECTIONS = ("q", "k", "v", "o")

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class ModelConfigError(LongjaxError, ValueError):
  """A model config the decoder cannot run (family, rope type, dtype, head counts...)."""


def remat_mode(value):
  """A config's ``train.remat`` / ``model.remat`` as ``ModelConfig.remat``: a bool, or
  ``"dots"``."""
  if isinstance(value, str) and value != "dots":
    raise ModelConfigError(f"remat={value!r}: use True (least memory), 'dots' (keep matmul "
                           "outputs: faster, more memory) or False")
  return value if value == "dots" else bool(value)


def dtype_of(name: str):
  try:
    return _DTYPES[name]
  except KeyError:
    raise ModelConfigError(f"unsupported dtype {name!r}; choose one of {sorted(_DTYPES)}") from None


_SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "max_position_embeddings")
_HF_SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only LM.

  ``alt_projections`` lists the attention projections (subset of q/k/v/o) that have a second,
  alternative copy used by tokens flagged in the forward pass (beacon tokens, FocusLLM
  candidates). ``num_alt_embeddings`` adds that many extra embedding rows, addressed by token ids
  ``vocab_size .. vocab_size + num_alt_embeddings - 1`` (the beacon token).
  """
  family: str = "llama"
  vocab_size: int = 256
  hidden_size: int = 64
  intermediate_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  rope_theta: float = 10000.0
  rope_scaling: Optional[tuple] = None  # sorted (key, value) pairs of the HF dict; hashable
  max_position_embeddings: int = 2048
  rms_norm_eps: float = 1e-6
  attention_bias: bool = False  # bias on q/k/v (Qwen2: True)
  tie_word_embeddings: bool = False
  # Per-layer sliding window (None = full attention), e.g. Mistral v0.1's 4096.
  sliding_windows: Optional[tuple] = None
  bos_token_id: Optional[int] = 1
  eos_token_id: Any = 2
  pad_token_id: Optional[int] = None
  alt_projections: tuple = ()
  num_alt_embeddings: int = 0
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  # Rematerialise each decoder layer when differentiated: False; True (keep only the layer
  # inputs: least memory); "dots" (also keep the matmul outputs: no matmul is recomputed,
  # ~12 % faster beacon training steps on SmolLM2 for ~1.5x the activation memory).
  remat: Any = False
  # The HF config.json this config was read from, verbatim, as canonical JSON (sorted keys), so
  # that export gives back every key with its JSON type (an empty dict stays a dict) while the
  # config stays hashable (a static jit argument).
  hf_extra: Optional[str] = None

  def __post_init__(self):
    for name in _SIZE_FIELDS:
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
        raise ModelConfigError(f"model config field {name} must be a positive integer, got {v!r}; "
                               "fix the config")
    if self.remat not in REMAT_MODES:
      raise ModelConfigError(f"remat must be one of {REMAT_MODES}, got {self.remat!r}")
    if self.family not in FAMILIES:
      raise ModelConfigError(f"unsupported family {self.family!r}; supported: {FAMILIES}")
    if self.num_heads % self.num_kv_heads:
      raise ModelConfigError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")
    bad = [p for p in self.alt_projections if p not in ALT_PROJECTIONS]
    if bad:
      raise ModelConfigError(f"alt_projections {bad} not in {ALT_PROJECTIONS}")
    if self.sliding_windows is not None and len(self.sliding_windows) != self.num_layers:
      raise ModelConfigError("sliding_windows needs one entry (int or None) per layer")
    dtype_of(self.dtype), dtype_of(self.param_dtype)
    if self.hf_extra is not None and not isinstance(self.hf_extra, str):
      raise ModelConfigError("hf_extra must be the HF config as a JSON string (see hf_json)")
    self.rope_type  # validates rope_scaling

  @property
  def rope_scaling_dict(self) -> Optional[dict]:
    return None if self.rope_scaling is None else dict(self.rope_scaling)

  @property
  def rope_type(self) -> str:
    rs = self.rope_scaling_dict
    if not rs:
      return "default"
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind not in ROPE_TYPES:
      raise ModelConfigError(f"rope_scaling type {kind!r} is not supported; "
                             f"supported: {ROPE_TYPES}")
    return kind

  @property
  def max_positions(self) -> int:
    """The longest position the model was trained for, rope scaling included (HF's
    ``max_position_embeddings * factor``)."""
    rs = self.rope_scaling_dict or {}
    return int(self.max_position_embeddings * rs.get("factor", 1))

  @property
  def compute_dtype(self):
    return dtype_of(self.dtype)

  @property
  def params_dtype(self):
    return dtype_of(self.param_dtype)

  @property
  def has_sliding_window(self) -> bool:
    return self.sliding_windows is not None and any(w is not None for w in self.sliding_windows)

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  # ------------------------------------------------------------------------------------------
  # HF config.json <-> ModelConfig
  @classmethod
  def from_hf(cls, hf: dict, **overrides) -> "ModelConfig":
    if not isinstance(hf, dict):
      raise ModelConfigError(f"config.json holds a JSON {type(hf).__name__}, not an object of "
                             "model settings; use the model's own config.json")
    for key in _HF_SIZE_KEYS:
      v = hf.get(key)
      if key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads") and v is None:
        raise ModelConfigError(f"config.json lacks {key}; is this a LLaMA/Qwen2/Mistral config?")
      if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
        raise ModelConfigError(f"config.json field {key} is {v!r} ({type(v).__name__}); it must be "
                               f"a positive integer (e.g. {key}: 2, not \"2\"): fix config.json")
    hf = dict(hf)
    source = hf_json(hf)
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
      raise ModelConfigError(f"unsupported model_type {model_type!r} in config.json; longjax "
                             f"supports {FAMILIES} (LLaMA-2/3, Qwen2, Mistral)")
    n_layers = hf["num_hidden_layers"]
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    rope = hf.get("rope_scaling")
    rope_theta = hf.get("rope_theta")
    params = hf.get("rope_parameters")  # transformers 5 folds theta + scaling into this dict
    if params:
      rope_theta = params.get("rope_theta", rope_theta)
      if params.get("rope_type", "default") != "default":
        rope = {k: v for k, v in params.items() if k != "rope_theta"}
    if rope and rope.get("rope_type", rope.get("type")) == "default":
      rope = None
    windows = None
    if model_type == "mistral" and hf.get("sliding_window"):
      windows = (int(hf["sliding_window"]),) * n_layers
    if model_type == "qwen2" and hf.get("use_sliding_window"):
      types = hf.get("layer_types") or [
          "sliding_attention" if i >= hf.get("max_window_layers", n_layers) else "full_attention"
          for i in range(n_layers)]
      windows = tuple(int(hf["sliding_window"]) if t == "sliding_attention" else None
                      for t in types)
      if not any(windows):
        windows = None
    bias = hf.get("attention_bias", model_type == "qwen2")
    if hf.get("mlp_bias"):
      raise ModelConfigError("mlp_bias=True is not supported (no LLaMA/Qwen2/Mistral release "
                             "uses it)")
    dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    kw = dict(
        family=model_type, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=n_layers, num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
        rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
        rope_scaling=None if not rope else _hashable(rope),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), attention_bias=bool(bias),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), sliding_windows=windows,
        bos_token_id=hf.get("bos_token_id"), eos_token_id=_hashable(hf.get("eos_token_id")),
        pad_token_id=hf.get("pad_token_id"), param_dtype=dtype if dtype in _DTYPES else "float32",
        dtype="float32")
    kw["hf_extra"] = source
    kw.update(overrides)
    return cls(**kw)

  def to_hf(self) -> dict:
    """A ``config.json`` dict that ``transformers`` loads as the same architecture.

    It starts from the config this one was read from (``hf_extra``): keys longjax does not use
    come back verbatim, and so does the spelling of every field this config did not change (an
    absent ``head_dim``, an unused ``sliding_window``, transformers 5's ``rope_parameters``), so
    load -> save gives back the same JSON object.
    """
    out = self._hf_fields()
    if not self.hf_extra:
      return out
    source = json.loads(self.hf_extra)
    before = ModelConfig.from_hf(source)._hf_fields()
    changed = {k: v for k, v in out.items() if k not in before or before[k] != v}
    merged = dict(source)
    for k in before.keys() - out.keys():  # written only for a setting this config turned off
      merged.pop(k, None)
    merged.update(changed)
    if "rope_parameters" in source and changed.keys() & {"rope_theta", "rope_scaling"}:
      # transformers 5 reads rope_parameters before rope_theta / rope_scaling: keep it in step.
      merged["rope_parameters"] = dict(self.rope_scaling_dict or {"rope_type": "default"},
                                       rope_theta=self.rope_theta)
    return merged

  def _hf_fields(self) -> dict:
    """The config.json fields this config determines (transformers 4 spelling)."""
    out = dict(
        model_type=self.family, vocab_size=self.vocab_size, hidden_size=self.hidden_size,
        intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
        num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
        head_dim=self.head_dim, rope_theta=self.rope_theta,
        rope_scaling=None if self.rope_scaling is None else _plain(dict(self.rope_scaling)),
        max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
        tie_word_embeddings=self.tie_word_embeddings, bos_token_id=self.bos_token_id,
        eos_token_id=_plain(self.eos_token_id), pad_token_id=self.pad_token_id,
        torch_dtype=self.param_dtype, hidden_act="silu",
        architectures=[{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                        "mistral": "MistralForCausalLM"}[self.family]])
    if self.family == "llama":
      out["attention_bias"] = self.attention_bias
    if self.family == "mistral":
      out["sliding_window"] = self.sliding_windows[0] if self.has_sliding_window else None
    if self.family == "qwen2":
      out["use_sliding_window"] = self.has_sliding_window
      if self.has_sliding_window:
        out["sliding_window"] = next(w for w in self.sliding_windows if w)
        out["layer_types"] = ["sliding_attention" if w else "full_attention"
                              for w in self.sliding_windows]
    return out


def hf_json(hf: dict) -> str:
  """A HF config dict as the canonical JSON string ``ModelConfig.hf_extra`` holds."""
  return json.dumps(hf, sort_keys=True, separators=(",", ":"))


def _hashable(v):
  """JSON value -> hashable value (dicts become sorted tuples of pairs), so configs can be static.
  Only for rope_scaling (a flat dict) and eos_token_id; hf_extra keeps the exact JSON."""
  if isinstance(v, dict):
    return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
  if isinstance(v, list):
    return tuple(_hashable(x) for x in v)
  return v


def _plain(v):
  if isinstance(v, tuple):
    if v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
      return {k: _plain(x) for k, x in v}
    return [_plain(x) for x in v]
  if isinstance(v, dict):
    return {k: _plain(x) for k, x in v.items()}
  return v
