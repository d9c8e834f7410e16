"""The sections of a run config (``configs/*.py``) as frozen dataclasses, with their defaults.

A field's default here is the one default of that key: ``configs/common.py`` builds the config
files' sections from these classes, and a key a config leaves out (a section written by older code,
a ``config.json`` of an older run) takes it. A field that defaults to ``None`` is one a config may
leave unset; it is then left out of the config's dict (``to_dict``), so that what a run records
(``config.json``, the tiny base's recipe, a checkpoint's fingerprint) reads as it always did.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional, Tuple

# train.layout (beacon): where the last window's beacons go in training
# (longjax.beacon.task.BeaconTask)
LAYOUTS = ("official", "inference")
# data.loss_on: which tokens the loss is on
LOSS_ON = ("all", "answer", "distill")


@dataclasses.dataclass(frozen=True)
class SyntheticSection:
  """``data.synthetic`` / ``model.pretrain.synthetic``: generated documents (``synthetic:NAME``)."""
  count: int = 256
  min_chars: int = 256
  max_chars: int = 512
  digits: int = 5
  style: Optional[str] = None  # passkey documents: None = longjax.data.synthetic's own default


@dataclasses.dataclass(frozen=True)
class PretrainSection:
  """``model.pretrain``: the tiny base LM, trained from scratch before the method's run."""
  steps: int = 150
  batch: int = 16
  lr: float = 3e-3
  length: int = 64  # its native window (tokens per context)
  warmup_steps: int = 0
  weight_decay: float = 0.0
  save_every: int = 0  # 0: at the last step only
  sources: Optional[str] = None  # None: data.sources
  min_length: int = 16
  max_length: int = 10 ** 9
  synthetic: Optional[SyntheticSection] = None  # None: data.synthetic
  loss_on: Optional[str] = None  # None: every token


@dataclasses.dataclass(frozen=True)
class ModelSection:
  """``model``: a checkpoint (HF or longjax directory, or ``smollm2``) or the tiny model's shape."""
  checkpoint: str = ""  # "": the tiny model below, with the byte tokenizer
  name: Optional[str] = None  # a released model's name: its checkpoint must then be given
  tokenizer: Optional[str] = None  # overrides data.tokenizer (longjax.data.tokenizers)
  family: Optional[str] = None
  hidden_size: Optional[int] = None
  intermediate_size: Optional[int] = None
  num_layers: Optional[int] = None
  num_heads: Optional[int] = None
  num_kv_heads: Optional[int] = None
  head_dim: Optional[int] = None
  max_position_embeddings: int = 32768  # the tiny model's
  rope_theta: float = 10000.0  # the tiny model's
  dtype: str = "float32"  # every matmul
  param_dtype: str = ""  # the frozen weights; "": as loaded
  remat: Any = False  # longjax.models.config.remat_mode
  pretrain: Optional[PretrainSection] = None


@dataclasses.dataclass(frozen=True)
class DataSection:
  """``data``: the training sources and how documents become token rows (longjax.data)."""
  # comma-separated specs (longjax.data.sources), each optionally SPEC@OBJECTIVE and/or
  # SPEC@ratio=N (longjax.run_config.source_options)
  sources: str = ""
  # "": the model's own (the checkpoint's files; byte for the tiny model). Naming one overrides it
  # ("byte" with a checkpoint that has its own tokenizer is an error).
  tokenizer: str = ""
  text_field: str = "text"
  tfds_data_dir: str = ""
  tfds_split: str = "train"
  min_length: int = 0
  max_length: int = 1 << 30
  append_eos: bool = True
  add_bos: Any = "auto"
  max_per_source: int = 0
  loss_on: str = "all"  # one of LOSS_ON
  synthetic: Optional[SyntheticSection] = None  # None: longjax.data.synthetic's own sizes
  # "STEP:WINDOWS,...": the longest documents (beacon windows) trained on from each step
  # (longjax.run_config.curriculum); "": every document from the start
  curriculum: str = ""


@dataclasses.dataclass(frozen=True)
class MeshSection:
  data: int = -1
  fsdp: int = 1
  tensor: int = 1


@dataclasses.dataclass(frozen=True)
class ClusterSection:
  """A multi-process run (longjax.train.distributed): empty / 0 / -1 = from
  $JAX_COORDINATOR_ADDRESS, $JAX_NUM_PROCESSES, $JAX_PROCESS_ID, else detected by JAX."""
  coordinator_address: str = ""
  num_processes: int = 0
  process_id: int = -1


@dataclasses.dataclass(frozen=True)
class DistillSettings:
  """``train.distill`` (data.loss_on="distill" or a source "...@distill"): the teacher's top
  ``top_k`` tokens per position are the target; ``alpha`` > 0 weights each token by
  ``base_weight + alpha * clip(log p_full - log p_trunc, 0, 2)`` (how much more likely the
  full-context base finds the next token than the base reading only the last W tokens: the tokens
  that need far context count up to base_weight + 2 alpha times). ``base_weight`` 0 distills only
  the tokens the far context helps (the rest weigh nothing): the memory is asked for what only it
  can give, not for a better local language model.

  ``rest``: what happens to the teacher's mass outside its top ``top_k`` (on SmolLM2 prose ~12 %,
  and ~13 % of the true next tokens lie there). ``"bucket"``: it is one more target class, the
  student's mass outside those ids: KL over top_k + 1 classes, 0 when the student equals the
  teacher. ``"renormalise"``: the top ``top_k`` are renormalised to sum to 1, which
  teaches the student to starve the rest of the vocabulary.

  ``answer_weight``: each distilled token inside a sample's answer span (the record's ``output``)
  counts this many times (1: like any other token). The answer is the few tokens of a question
  document that need what the memory holds; among thousands of prose and question tokens they
  are otherwise too few to keep exact values (digits, codes) in the memory."""
  top_k: int = 32
  alpha: float = 0.0
  rest: str = "bucket"
  answer_weight: float = 1.0
  base_weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class TrainSection:
  """``train``: the optimizer, the step, checkpoints, the mesh (longjax.train.loop)."""
  num_steps: int = 0  # 0: num_epochs over the data
  num_epochs: int = 1
  global_batch: int = 8
  grad_accum: int = 1
  lr: float = 5e-5
  end_lr: float = 0.0
  warmup_steps: int = 0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  max_grad_norm: float = 1.0
  remat: Any = True
  step_bucket: int = 1
  log_every: int = 1
  save_every: int = 1000
  keep: int = 3
  async_checkpoint: bool = True
  export: bool = True
  distributed: str = "auto"
  impl: str = "auto"
  tensorboard: bool = True
  progress: bool = True
  layout: str = "official"  # one of LAYOUTS (beacon)
  init_from: str = ""  # a committed asset whose method tensors start this run
  mesh: MeshSection = MeshSection()
  cluster: ClusterSection = ClusterSection()
  distill: DistillSettings = DistillSettings()


@dataclasses.dataclass(frozen=True)
class BeaconSection:
  """``beacon``: Activation Beacon's settings as a config names them, with the official defaults
  (``longjax.beacon.config.BeaconConfig`` extends and validates them)."""
  window: int = 1024
  stride: int = 1024
  ratios: Tuple[int, ...] = (2, 4, 8, 16, 32)
  ratio_mix: str = "step-random"
  pos: str = "interleave"
  attn: str = "full-coverage"
  param: Tuple[str, ...] = ("q", "k", "v")
  sink_size: int = 0
  embed_init: str = "eos"
  attend_prev: bool = True
  # data.loss_on="distill" (KL to the full-attention base) is for it
  distills: ClassVar[bool] = True
  windowed: ClassVar[bool] = True  # documents count in windows: data.curriculum is for it


@dataclasses.dataclass(frozen=True)
class FocusSection:
  """``focus``: FocusLLM's settings (``longjax.focus.config.FocusConfig.from_config``) and its
  training sampler's (``strides``, ``min_local``, ``objective``, ``steps``, ``dense_share``:
  ``longjax.focus.task.FocusTask``)."""
  local_window: int = 1024
  stride: int = 1024  # the chunk stride at inference
  strides: Tuple[int, ...] = (1024,)  # training: one drawn per sample
  prompt_cap: Optional[int] = None  # None: min(512, local_window), the official cap
  param: Tuple[str, ...] = ("q", "k", "v", "o")
  min_len_threshold: int = 4096  # the official hard-coded chunking threshold
  min_local: int = 30
  objective: str = "random"
  # teacher-forced decode steps scored per training sample (docs/focusllm.md §5.1; 1: official)
  steps: int = 1
  # the share of optimizer steps that score every local token instead, the candidates fixed from
  # the memory before the local span (docs/focusllm.md §5.3; 0: none)
  dense_share: float = 0.0
  # the candidate gate's strength (docs/focusllm.md, "Candidate gate"; 0: the official method)
  candidate_gate: float = 0.0
  # chunks the base is at least this sure of keep their full weight under the gate (1: none)
  gate_threshold: float = 1.0
  # and only where they make it this many times surer than the dynamic prompt alone (0: off)
  gate_gain: float = 0.0
  # and this many times surer than the median of the prompt's other chunks (0: off)
  gate_peer_gain: float = 0.0
  # a chunk is weighed by the best of its this many most likely tokens, a later one against the
  # other chunks' largest probability of it (1: its top token)
  gate_top_k: int = 1
  # every chunk but the first also reads this many memory tokens before it (docs/focusllm.md,
  # "Chunk overlap"; 0: the official method)
  chunk_overlap: int = 0
  # the chunk vote (docs/focusllm.md, "Chunk vote"; 0: off): a reading only, which the training
  # losses do not apply; here so that an asset exported from the run reads as the run was read
  chunk_vote: float = 0.0
  vote_min: float = 0.0  # the surest chunk votes only when at least this sure
  vote_open: bool = False  # and only when the candidate gate reads it at full weight
  distills: ClassVar[bool] = True  # KL to the base on its scored steps (focusllm.md §5.2)
  windowed: ClassVar[bool] = False
