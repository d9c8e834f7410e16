"""Activation Beacon settings: ``BeaconConfig``, validated on construction.

Field names follow the official ``beacon_*`` config fields (docs/beacon.md §1) without the prefix.
The defaults are the official defaults. Combinations the official code cannot run (docs/beacon.md
§1, §3.5) are refused here with an explanation, instead of being approximated:

* ``pos="interleave"`` needs ``stride == window`` (official assert).
* ``pos="append"`` with ``stride < window`` raises ``NameError`` in the official code
  (``raw_size_to_cache`` undefined). longjax runs what that code means to do (docs/beacon.md §2.1:
  after a full window ``S / r`` beacons cover its first ``S`` tokens and its last ``W - S`` raw
  tokens stay raw for the next window), so every token reads at least ``W - S`` raw tokens besides
  the memory. A longjax extension with no official output to compare with; ratio 0 is refused with
  it (which raw tokens would become memory is undefined).
* ``attn="step-expansion"`` with ``pos="interleave"`` is broken in the official code (indexes a
  mask with a 0/1 LongTensor); refused.
* ``attn="segmentation"`` raises in the official code for both layouts; refused.
* ``attn="step-expansion"`` with ``attend_prev=False`` (append) would need one mask kind per beacon;
  not implemented, refused.
* every positive ratio must divide ``stride`` (the official code silently drops such ratios; we
  refuse them so that the configured list is the list in use).
"""
from __future__ import annotations

import dataclasses
import numbers
import re
from typing import Optional, Sequence, Tuple

import numpy as np

from longjax.errors import LongjaxError
from longjax.run_config.sections import BeaconSection

RATIO_MIXES = ("step-random", "instance-random", "sequence")  # plus "adapt-N"
POSITIONS = ("interleave", "append")
ATTNS = ("full-coverage", "step-expansion", "segmentation")
PARAMS = ("q", "k", "v", "o")
EMBED_INITS = ("eos", "bos")

# Official config field name -> BeaconConfig field name.
HF_FIELDS = {
    "beacon_window": "window",
    "beacon_stride": "stride",
    "beacon_ratio": "ratios",
    "beacon_ratio_mix": "ratio_mix",
    "beacon_pos": "pos",
    "beacon_attn": "attn",
    "beacon_param": "param",
    "beacon_sink_size": "sink_size",
    "beacon_embed_init": "embed_init",
    "beacon_attend_prev": "attend_prev",
    "beacon_parallel_window": "parallel_window",
}


class BeaconConfigError(LongjaxError, ValueError):
  pass


def _is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


@dataclasses.dataclass(frozen=True)
class BeaconConfig(BeaconSection):
  """Activation Beacon configuration (official defaults), validated.

  * ``window`` (W) raw tokens per window; ``stride`` (S) advance after a full window.
  * ``ratios``: candidate compression ratios (raw tokens per beacon); ``0`` keeps the window raw.
  * ``ratio_mix``: ``step-random`` | ``instance-random`` | ``sequence`` | ``adapt-N``.
  * ``pos``: ``interleave`` (a beacon after every r raw tokens) | ``append`` (beacons after the
    window).
  * ``attn``: ``full-coverage`` | ``step-expansion`` (append only).
  * ``param``: attention projections with beacon copies (subset of q/k/v/o).
  * ``sink_size``: leading KV entries kept forever (with the official quirk, docs/beacon.md §4.4).
  * ``embed_init``: ``eos`` | ``bos``: source row of a missing beacon embedding.
  * ``attend_prev``: step-expansion only: beacons see earlier beacons of the window.
  * ``parallel_window``: official speed feature; only 1 is supported (it does not change results).
  * ``seed``: seed of the ratio RNG (official: ``np.random.default_rng(42)``).
  """
  # the fields a run config's ``beacon`` section sets, and their defaults, are BeaconSection's
  parallel_window: int = 1
  seed: int = 42

  def __post_init__(self):
    err = lambda msg: BeaconConfigError(f"invalid BeaconConfig: {msg}")  # noqa: E731
    ratios = self.ratios if isinstance(self.ratios, (list, tuple)) else (self.ratios,)
    # int() would truncate a ratio of 2.5 to 2 and read True as 1: only integers are settings.
    bad = [r for r in ratios if not _is_int(r)]
    if bad:
      raise err(f"ratios must be integers, got {list(ratios)}")
    for name in ("window", "stride", "sink_size", "parallel_window", "seed"):
      if not _is_int(getattr(self, name)):
        raise err(f"{name} must be an integer, got {getattr(self, name)!r}")
    if not isinstance(self.attend_prev, (bool, np.bool_)):
      raise err(f"attend_prev must be true or false, got {self.attend_prev!r}")
    object.__setattr__(self, "ratios", tuple(int(r) for r in ratios))
    object.__setattr__(self, "param", tuple(self.param))
    if self.window < 1 or self.stride < 1:
      raise err(f"window ({self.window}) and stride ({self.stride}) must be >= 1")
    if self.stride > self.window:
      raise err(f"stride ({self.stride}) must be <= window ({self.window})")
    if self.pos not in POSITIONS:
      raise err(f"pos {self.pos!r} not in {POSITIONS}")
    if self.attn not in ATTNS:
      raise err(f"attn {self.attn!r} not in {ATTNS}")
    if self.pos == "interleave" and self.stride != self.window:
      raise err(f"pos='interleave' requires stride == window (got stride {self.stride}, "
                f"window {self.window}); the official code asserts this")
    if self.stride != self.window and 0 in self.ratios:
      raise err(f"ratio 0 (keep whole windows) with stride ({self.stride}) < window "
                f"({self.window}) is undefined (which raw tokens become memory?); use stride == "
                "window or positive ratios")
    if self.attn == "segmentation":
      raise err("attn='segmentation' is broken in the official code (TypeError with append, "
                "NotImplementedError with interleave); use 'full-coverage'")
    if self.attn == "step-expansion" and self.pos == "interleave":
      raise err("attn='step-expansion' with pos='interleave' is broken in the official code "
                "(docs/beacon.md §3.5); use 'full-coverage', or pos='append'")
    if self.attn == "step-expansion" and not self.attend_prev:
      raise err("attn='step-expansion' with attend_prev=False is not supported by longjax "
                "(needs a per-beacon mask kind); use attend_prev=True")
    if not self.ratios:
      raise err("ratios must not be empty")
    bad = [r for r in self.ratios if r < 0]
    if bad:
      raise err(f"ratios must be >= 0, got {bad}")
    bad = [r for r in self.ratios if r > 0 and (self.stride % r or r > self.stride)]
    if bad:
      raise err(f"stride ({self.stride}) must be divisible by every positive ratio; {bad} do not "
                "divide it (the official code would silently drop them)")
    if self.ratio_mix not in RATIO_MIXES and not re.fullmatch(r"adapt-\d+", self.ratio_mix):
      raise err(f"ratio_mix {self.ratio_mix!r} not in {RATIO_MIXES} or 'adapt-N'")
    bad = [p for p in self.param if p not in PARAMS]
    if bad:
      raise err(f"param {bad} not in {PARAMS}")
    if self.sink_size < 0:
      raise err(f"sink_size must be >= 0, got {self.sink_size}")
    if self.embed_init not in EMBED_INITS:
      raise err(f"embed_init {self.embed_init!r} not in {EMBED_INITS}")
    if self.parallel_window != 1:
      raise err("parallel_window > 1 is an official speed feature that longjax does not port "
                "(it does not change results); use 1")

  # ----------------------------------------------------------------------------------------
  @property
  def positive_ratios(self) -> Tuple[int, ...]:
    return tuple(r for r in self.ratios if r > 0)

  @property
  def max_beacons_per_call(self) -> int:
    """Most beacon (or memory-bound raw) slots one call can add: bounds the query slots."""
    n = self.window if self.pos == "interleave" else self.stride
    pos = self.positive_ratios
    return n // min(pos) if pos else 0

  @property
  def max_memory_per_window(self) -> int:
    """Most memory entries one full window adds (r = 0 keeps the whole window)."""
    pos = self.positive_ratios
    return max(self.window if 0 in self.ratios else 0, self.stride // min(pos) if pos else 0)

  @property
  def query_slots(self) -> int:
    """Static query length of the window step: W raw tokens plus the most beacons of one call."""
    return self.window + self.max_beacons_per_call

  @property
  def stride_query_slots(self) -> int:
    """Query slots a call after the first full window needs with append and stride S < W: S raw
    tokens plus their beacons (``query_slots`` when S = W)."""
    if self.stride == self.window:
      return self.query_slots
    return self.stride + self.max_beacons_per_call

  @property
  def adapt_n(self) -> Optional[int]:
    m = re.fullmatch(r"adapt-(\d+)", self.ratio_mix)
    return int(m.group(1)) if m else None

  def replace(self, **kw) -> "BeaconConfig":
    return dataclasses.replace(self, **kw)

  def check_ratio(self, ratio: int):
    if ratio not in self.ratios:
      raise BeaconConfigError(f"beacon ratio {ratio} is not in the configured ratios "
                              f"{self.ratios}; configure it (BeaconConfig(ratios=...)) before "
                              "using it")

  # ----------------------------------------------------------------------------------------
  @classmethod
  def from_hf(cls, hf: dict, **overrides) -> "BeaconConfig":
    """From an official config.json dict (``beacon_*`` fields); missing fields keep defaults."""
    kw = {}
    for hf_name, name in HF_FIELDS.items():
      if hf.get(hf_name) is not None:
        kw[name] = hf[hf_name]
    for name in list(overrides):
      if name.startswith("beacon_"):
        overrides[HF_FIELDS[name]] = overrides.pop(name)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(kw.get("ratios"), int):
      kw["ratios"] = (kw["ratios"],)
    return cls(**kw)

  @classmethod
  def from_config(cls, b) -> "BeaconConfig":
    """From the ``beacon`` section of a run config (``longjax.run_config.BeaconSection``): the one
    builder train.py, eval.py and the scripts share."""
    return cls(**{f.name: getattr(b, f.name) for f in dataclasses.fields(BeaconSection)})

  def to_hf(self) -> dict:
    """The official ``beacon_*`` config fields."""
    out = {}
    for hf_name, name in HF_FIELDS.items():
      v = getattr(self, name)
      out[hf_name] = list(v) if isinstance(v, tuple) else v
    return out


def adapt_ratio(ratios: Sequence[int], length: int, window: int, max_positions: int) -> int:
  """The official ``adapt-N`` choice (``Memory.set_compression_ratio``), ``length`` = seen + N.

  For r > 0, ``max_len(r) = (P - W) * r + W``; for r = 0, ``max_len = P``. Pick the ratio with the
  smallest ``max_len >= length``; if none qualifies, the largest ratio.
  """
  best = None
  for r in ratios:
    max_len = max_positions if r == 0 else (max_positions - window) * r + window
    if max_len >= length and (best is None or max_len < best[0]):
      best = (max_len, r)
  return max(ratios) if best is None else best[1]
