"""FocusLLM settings (official names in brackets; see docs/focusllm.md §1)."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from longjax.ckpts.layout import alt_projections_of
from longjax.models.config import ALT_PROJECTIONS
from longjax.errors import LongjaxError

OFFICIAL_MIN_LEN = 4096  # the official hard-coded chunking threshold
OFFICIAL_PROMPT_CAP = 512  # truncate_size = min(512, stride, local_size)


class FocusError(LongjaxError, ValueError):
  """Bad FocusLLM input or settings (empty prompt, too many chunks, bad sizes, bad checkpoint)."""


@dataclasses.dataclass(frozen=True)
class FocusConfig:
  """How a long input is split into memory chunks and a local context.

  * ``local_window`` W [``local_window``]: the last W tokens are the local context.
  * ``chunk_stride`` S [``memory_stride``, one value]: the memory ``x[0:L-W]`` is cut into
    ``ceil((L-W)/S)`` chunks of S tokens (the last one shorter).
  * ``prompt_cap``: the dynamic prompt is the last ``P = min(prompt_cap, S, W)`` tokens, with a BOS
    in front unless it already starts with ``bos_id``. Default ``min(512, W)`` (official 512; a
    cap above W is refused, it could never apply).
  * ``candidate_projections`` [``beacon_param``]: which of q/k/v/o have candidate-token weights.
  * ``min_len_threshold``: inputs shorter than this (or not longer than W) run as the plain LM
    over ``bos(x)``; the official code hard-codes 4096, here it is a default.
  * ``max_chunks``: capacity of the per-chunk decode caches (chunks per prompt); more is an error.
  * ``bos_id``: the BOS id of the conditional-BOS rule (official: hard-coded 1).
  * ``candidate_gate`` (longjax; 0 = the official method): the strength ``beta`` of the candidate
    gate: each candidate's attention scores in the local forward get ``beta * log p``, ``p`` the
    frozen base's top next-token probability at that chunk's candidate slot (docs/focusllm.md,
    "Candidate gate").
  * ``gate_threshold`` tau (longjax; 1 = the plain gate): with the gate on, chunks where the base
    is at least tau sure keep their full weight; the bias is ``beta * min(0, log p - log tau)``.
  * ``gate_gain`` kappa (longjax; 0 = no reference): with the gate on, a chunk keeps its full
    weight only where it makes the base kappa times surer of its top token ``y`` than the dynamic
    prompt alone does (``p(y) >= max(tau, kappa * p_ref(y))``; one more row per prompt,
    docs/focusllm.md, "Candidate gate"): on prose, where the next token is often easy whatever a
    chunk holds, every chunk then fades.
  * ``gate_peer_gain`` kappa_p (longjax; 0 = no peer reference): with the gate on, a chunk keeps
    its full weight only where the base is also kappa_p times surer of its top token ``y`` than
    at the median of the prompt's other chunks (``p(y) >= kappa_p * median_j p_j(y)``): a token
    every chunk predicts comes from the text before the prompt, not from what one chunk holds.
  * ``gate_top_k`` K (longjax; 1 = the top token): with the gate on, a chunk is weighed by the one
    of its K most likely tokens that clears its level by most: a chunk whose first choice is what
    the prompt itself expects may hold the answer as its second. A later token's peer reference
    is the other chunks' *largest* probability of it, not their median: a runner-up counts only
    where it is this chunk's alone.
  * ``chunk_overlap`` O (longjax; 0 = the official method): every chunk but the first also reads
    the O memory tokens before it (chunk i is ``x[max(0, i*S-O) : (i+1)*S]``), so a fact cut by a
    chunk boundary is whole in one chunk row; the number of chunks (candidates) is unchanged
    (docs/focusllm.md, "Chunk overlap").
  * ``chunk_vote`` lambda (longjax; 0 = the official method): the next-token distribution is the
    local model's times the surest chunk's own to the power lambda (renormalised; a product of
    experts). A chunk's own distribution is the frozen base's at its candidate slot, which reads
    the chunk and the dynamic prompt whole (the candidate gate's signal); the surest chunk is the
    one whose top token is likeliest. The local model reads one candidate per chunk and may
    repeat or drop a digit the chunk itself copies exactly (docs/focusllm.md, "Chunk vote").
  * ``vote_min`` (longjax; 0 = always): the surest chunk votes only where its top token's
    probability is at least this.
  * ``vote_open`` (longjax; False = any chunk): only chunks the candidate gate reads at full
    weight may vote (the gate on): on prose, where a chunk is sure of its own text's next token,
    the gate's references fade it and it stays silent.
  """
  local_window: int = 1024
  chunk_stride: int = 1024
  prompt_cap: Optional[int] = None  # None: min(512, local_window), the official cap
  candidate_projections: tuple = ("q", "k", "v", "o")
  min_len_threshold: int = OFFICIAL_MIN_LEN
  max_chunks: int = 1024
  bos_id: int = 1
  candidate_gate: float = 0.0
  gate_threshold: float = 1.0
  gate_gain: float = 0.0
  gate_peer_gain: float = 0.0
  gate_top_k: int = 1
  chunk_overlap: int = 0
  chunk_vote: float = 0.0
  vote_min: float = 0.0
  vote_open: bool = False

  def __post_init__(self):
    object.__setattr__(self, "candidate_projections", tuple(self.candidate_projections))
    if self.prompt_cap is None and isinstance(self.local_window, int) and self.local_window >= 1:
      object.__setattr__(self, "prompt_cap", min(OFFICIAL_PROMPT_CAP, self.local_window))
    for name in ("local_window", "chunk_stride", "prompt_cap", "max_chunks"):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise FocusError(f"FocusConfig.{name} must be an integer >= 1, got {v!r}")
    if self.prompt_cap > self.local_window:
      raise FocusError(f"FocusConfig.prompt_cap ({self.prompt_cap}) must not exceed local_window "
                       f"({self.local_window}): the dynamic prompt is taken from the local context")
    if (not isinstance(self.min_len_threshold, int) or isinstance(self.min_len_threshold, bool)
        or self.min_len_threshold < 0):
      raise FocusError(f"FocusConfig.min_len_threshold must be an integer >= 0, got "
                       f"{self.min_len_threshold!r}")
    self._finite_ge0("candidate_gate", "the official method")
    tau = self.gate_threshold
    if (isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau)
        or not 0 < tau <= 1):
      raise FocusError(f"FocusConfig.gate_threshold must be a number in (0, 1] (1: no chunk keeps "
                       f"its full weight), got {tau!r}")
    object.__setattr__(self, "gate_threshold", float(tau))
    self._finite_ge0("gate_gain", "no reference row")
    self._finite_ge0("gate_peer_gain", "no peer reference")
    k = self.gate_top_k
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
      raise FocusError(f"FocusConfig.gate_top_k must be an integer >= 1 (1: each chunk's top "
                       f"token), got {k!r}")
    o = self.chunk_overlap
    if not isinstance(o, int) or isinstance(o, bool) or o < 0 or o >= self.chunk_stride:
      raise FocusError(f"FocusConfig.chunk_overlap must be an integer in [0, chunk_stride="
                       f"{self.chunk_stride}) (0: the official method), got {o!r}")
    self._finite_ge0("chunk_vote", "the official method")
    m = self.vote_min
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
      raise FocusError(f"FocusConfig.vote_min must be a number in [0, 1) (0: the surest chunk "
                       f"always votes), got {m!r}")
    object.__setattr__(self, "vote_min", float(m))
    if not isinstance(self.vote_open, bool):
      raise FocusError(f"FocusConfig.vote_open must be True or False, got {self.vote_open!r}")
    if self.vote_open and not (self.chunk_vote and self.candidate_gate):
      raise FocusError("FocusConfig.vote_open asks the candidate gate which chunks may vote: set "
                       f"chunk_vote > 0 and candidate_gate > 0 too (got chunk_vote="
                       f"{self.chunk_vote}, candidate_gate={self.candidate_gate}), or drop it")
    bad = [p for p in self.candidate_projections if p not in ALT_PROJECTIONS]
    if bad or not self.candidate_projections or len(set(self.candidate_projections)) != len(
        self.candidate_projections):
      raise FocusError(f"FocusConfig.candidate_projections must be a non-empty subset of "
                       f"{ALT_PROJECTIONS} without repeats, got {self.candidate_projections}")

  def _finite_ge0(self, name: str, zero: str):
    """Field ``name`` must be a finite number >= 0 (``zero``: what 0 means); stored as float."""
    v = getattr(self, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
      raise FocusError(f"FocusConfig.{name} must be a finite number >= 0 (0: {zero}), got {v!r}")
    object.__setattr__(self, name, float(v))

  @property
  def reference_rows(self) -> bool:
    """Whether the candidate gate reads each prompt's reference row (``gate_gain`` with the gate
    on)."""
    return bool(self.candidate_gate and self.gate_gain)

  @property
  def gate_reading(self) -> dict:
    """The candidate gate's settings as ``condense.gate_bias`` takes them."""
    return dict(strength=self.candidate_gate, threshold=self.gate_threshold, gain=self.gate_gain,
                peer_gain=self.gate_peer_gain, top_k=self.gate_top_k)

  @property
  def slot_signal(self) -> bool:
    """Whether the chunks' candidate slots are read by the frozen base (the candidate gate's and
    the chunk vote's signal)."""
    return bool(self.candidate_gate or self.chunk_vote)

  @property
  def prompt_len(self) -> int:
    """P = min(prompt_cap, S, W) at inference."""
    return min(self.prompt_cap, self.chunk_stride, self.local_window)

  def replace(self, **kw) -> "FocusConfig":
    return dataclasses.replace(self, **kw)

  def to_hf(self) -> dict:
    """The official config.json fields that carry these settings."""
    return {"local_window": self.local_window, "memory_stride": [self.chunk_stride],
            "beacon_param": list(self.candidate_projections)}

  @classmethod
  def from_hf(cls, hf: dict, **overrides) -> "FocusConfig":
    """Read ``local_window`` / ``memory_stride`` / ``beacon_param`` from an official config.json."""
    kw = {}

    def integer(name, v):  # int() would truncate 128.7 to 128 and read true as 1
      if isinstance(v, bool) or not isinstance(v, int):
        raise FocusError(f"{name} must be an integer, got {v!r}")
      return v

    if "local_window" in hf:
      kw["local_window"] = integer("local_window", hf["local_window"])
    stride = hf.get("memory_stride")
    if stride is not None:
      strides = list(stride) if isinstance(stride, (list, tuple)) else [stride]
      strides = [integer("memory_stride", s) for s in strides]
      if len(strides) != 1 and "chunk_stride" not in overrides:
        # Training draws one stride per sample; inference uses exactly one (official assert).
        raise FocusError(f"memory_stride {strides} has {len(strides)} values; inference uses one: "
                         "pass chunk_stride=... to choose it")
      if strides:
        kw["chunk_stride"] = strides[0]
    if hf.get("beacon_param"):
      bad = [p for p in hf["beacon_param"] if p not in ALT_PROJECTIONS]
      if bad:  # dropping them would run without projections the checkpoint was trained with
        raise FocusError(f"beacon_param {hf['beacon_param']} names {bad}, not one of "
                         f"{ALT_PROJECTIONS}")
      kw["candidate_projections"] = tuple(hf["beacon_param"])
    if isinstance(hf.get("bos_token_id"), int):  # the checkpoint's own BOS (official: always 1)
      kw["bos_id"] = hf["bos_token_id"]
    kw.update(overrides)
    return cls(**kw)

  @classmethod
  def from_config(cls, f, bos_id) -> "FocusConfig":
    """From the ``focus`` section of a run config (``longjax.run_config.FocusSection``) and the
    model's BOS id (``ModelConfig.bos_token_id``; None: the official 1): the one builder
    train.py, eval.py and the scripts share."""
    return cls(local_window=f.local_window, chunk_stride=f.stride,
               prompt_cap=f.prompt_cap or None, candidate_projections=tuple(f.param),
               min_len_threshold=f.min_len_threshold,
               bos_id=int(bos_id) if bos_id is not None else 1,
               candidate_gate=f.candidate_gate, gate_threshold=f.gate_threshold,
               gate_gain=f.gate_gain, gate_peer_gain=f.gate_peer_gain,
               gate_top_k=f.gate_top_k, chunk_overlap=f.chunk_overlap,
               chunk_vote=f.chunk_vote, vote_min=f.vote_min, vote_open=f.vote_open)


def check_model(cfg, fcfg: FocusConfig, params: Optional[dict] = None):
  """The decoder must carry exactly the candidate projections FocusConfig asks for."""
  if set(cfg.alt_projections) != set(fcfg.candidate_projections):
    raise FocusError(f"model has alternative projections {cfg.alt_projections or '()'} but "
                     f"FocusConfig.candidate_projections is {fcfg.candidate_projections}; load the "
                     "checkpoint with longjax.focus.load_focus (init_candidates='copy' for a "
                     "plain LLM)")
  if params is not None:
    present = alt_projections_of(params)
    missing = [p for p in fcfg.candidate_projections if p not in present]
    if missing:
      raise FocusError(f"parameters lack candidate projections {missing} (alt_*_proj)")
