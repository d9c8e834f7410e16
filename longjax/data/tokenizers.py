"""The one tokenizer of training and evaluation: the checkpoint's HF tokenizer (local files only)
or the built-in byte tokenizer of the tiny configs, behind :class:`Tokenizer`.

:func:`get_tokenizer` loads one from a spec (``"byte"`` or a directory); :func:`choose_tokenizer`
is the one rule train.py and eval.py share for *which* spec a run uses: an explicit
``config.model.tokenizer`` / ``config.data.tokenizer``, else the model's own. eval.py reports the
refusals below as ``EvalError`` (``longjax.eval.models.load_tokenizer``).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

from longjax.errors import LongjaxError


class ByteTokenizer:
  """The built-in byte-level tokenizer of the tiny default configs (no files, no network).

  Ids 0/1/2 are pad/BOS/EOS; byte ``b`` is id ``b + 3``. Decoding ignores special ids and replaces
  invalid UTF-8 (a tiny model can emit any byte sequence)."""
  pad_token_id = 0
  bos_token_id = 1
  eos_token_id = 2
  offset = 3
  vocab_size = 256 + 3

  def encode(self, text: str, add_bos: bool = False) -> list:
    ids = [b + self.offset for b in text.encode("utf-8")]
    return [self.bos_token_id] + ids if add_bos else ids

  def decode(self, ids) -> str:
    data = bytes(int(i) - self.offset for i in ids if self.offset <= int(i) < self.vocab_size)
    return data.decode("utf-8", errors="replace")


class Tokenizer:
  """One interface over a :class:`ByteTokenizer` or a transformers tokenizer (``tok``), so that
  training and evaluation tokenize a text the same way.

  Training encodes segments without special tokens and adds BOS itself when the tokenizer would
  (:attr:`adds_bos`); evaluation also encodes with the default special tokens, builds chat prompts
  and the passkey answer's ids. ``hf`` is the transformers tokenizer (None for bytes): what an
  export saves next to the model. ``name`` is the spec it was loaded from."""

  def __init__(self, tok, name: str = ""):
    self.tok = tok
    self.hf = None if isinstance(tok, ByteTokenizer) else tok
    self.name = name or ("byte" if self.hf is None else str(getattr(tok, "name_or_path", "")))

  @property
  def bos_id(self) -> Optional[int]:
    return getattr(self.tok, "bos_token_id", None)

  @property
  def eos_id(self) -> Optional[int]:
    return getattr(self.tok, "eos_token_id", None)

  @property
  def vocab_size(self) -> int:
    return int(self.tok.vocab_size) if self.hf is None else len(self.tok)

  @functools.cached_property
  def adds_bos(self) -> bool:
    """Whether the default special tokens start with BOS (LLaMA, the byte tokenizer): training
    then starts each document with BOS (``data.add_bos='auto'``)."""
    probe = self.encode("a", special=True)
    return bool(probe) and self.bos_id is not None and probe[0] == self.bos_id

  def encode(self, text: str, special: bool = False) -> list:
    """``special=True``: what the tokenizer adds by default (BOS for LLaMA / the byte tokenizer)."""
    if self.hf is None:
      return list(self.tok.encode(text, add_bos=special))
    return list(self.tok.encode(text, add_special_tokens=special))

  def decode(self, ids) -> str:
    """Special tokens left out (a generation's EOS is not text)."""
    ids = [int(i) for i in ids]
    if self.hf is None:
      return self.tok.decode(ids)
    return self.tok.decode(ids, skip_special_tokens=True)

  def answer_ids(self, answer: str) -> list:
    """Ids of ``answer`` as a continuation (FocusLLM passkey budget): the official
    ``tokenize(str(k))[1:]`` for HF tokenizers (with LLaMA-2's SentencePiece this keeps the
    word-start token); the byte tokenizer has no word-start token, so the space is spelled out."""
    if self.hf is None:
      return self.encode(" " + answer)
    ids = self.encode(answer, special=True)
    return ids[1:] if ids and self.bos_id is not None and ids[0] == self.bos_id else ids

  @property
  def has_chat_template(self) -> bool:
    return bool(self.hf is not None and getattr(self.tok, "chat_template", None))

  def prompt_ids(self, text: str, chat: bool) -> list:
    """Token ids of a prompt: wrapped as one user turn with the generation prompt when ``chat``
    and the tokenizer has a chat template, else encoded with the default special tokens."""
    if chat and self.has_chat_template:
      ids = self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                         add_generation_prompt=True)
      if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
      return [int(i) for i in ids]
    return self.encode(text, special=True)

  @property
  def newline_id(self) -> int:
    """The id LongBench adds as an extra EOS: ``encode("\\n")[-1]``."""
    return self.encode("\n")[-1]


class TokenizerFilesError(LongjaxError, FileNotFoundError):
  """A tokenizer directory without (usable) tokenizer files."""


# Any of these makes a directory a HF tokenizer directory (fast, sentencepiece, BPE, WordPiece).
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
               "sentencepiece.bpe.model")


def check_tokenizer_dir(spec) -> None:
  """Refuse a directory without tokenizer vocabulary files: transformers would otherwise build a
  tokenizer that knows one token (every text encodes to unknowns)."""
  d = Path(spec)
  if not any((d / f).is_file() for f in VOCAB_FILES):
    raise TokenizerFilesError(f"{spec} holds no tokenizer files (one of {', '.join(VOCAB_FILES)}); "
                              "put the model's tokenizer files there or set "
                              "--config.data.tokenizer (a HF model dir, or 'byte')")


def check_vocab(t, spec) -> None:
  """A loaded HF tokenizer must know more than one token."""
  if len(t) <= 1:
    raise TokenizerFilesError(f"the tokenizer in {spec} has {len(t)} token(s); its files are "
                              "incomplete (a tokenizer_config.json without a vocabulary?)")


def get_tokenizer(spec: str) -> Tokenizer:
  """``"byte"`` or a local directory with HF tokenizer files."""
  if spec == "byte":
    return Tokenizer(ByteTokenizer(), "byte")
  if not spec or not Path(spec).is_dir():
    raise TokenizerFilesError(f"tokenizer directory {spec!r} does not exist; set "
                              "--config.data.tokenizer=/path/to/hf_model (or 'byte')")
  check_tokenizer_dir(spec)
  from transformers import AutoTokenizer
  try:
    t = AutoTokenizer.from_pretrained(spec, local_files_only=True, trust_remote_code=False)
  except Exception as e:
    raise TokenizerFilesError(f"cannot load a HF tokenizer from {spec}: {type(e).__name__}: "
                              f"{e}; put the tokenizer files there or set "
                              "--config.data.tokenizer (a HF model dir, or 'byte')") from None
  check_vocab(t, spec)
  return Tokenizer(t, spec)


# ------------------------------------------------------------------------------------------------
# Which tokenizer: the model's own unless the user names one.
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
# A model trained with the byte tokenizer has no HF files to export; this file says "byte".
BYTE_MARKER = "longjax_tokenizer.json"


class TokenizerChoiceError(LongjaxError, ValueError):
  """The configured tokenizer contradicts the checkpoint's own."""


def own_tokenizer(checkpoint: str) -> str:
  """The tokenizer a model comes with: ``"byte"`` for the tiny random model (no checkpoint) and
  for exports of byte-tokenizer runs (:data:`BYTE_MARKER`), the checkpoint directory when it
  holds HF tokenizer files, else ``""`` (unknown)."""
  if not checkpoint:
    return "byte"
  d = Path(checkpoint)
  if any((d / f).exists() for f in HF_TOKENIZER_FILES):
    return str(checkpoint)
  marker = d / BYTE_MARKER
  if marker.exists() and json.loads(marker.read_text()).get("tokenizer") == "byte":
    return "byte"
  return ""


def choose_tokenizer(config, checkpoint: str) -> str:
  """The tokenizer spec of a run (``config``: its ``RunConfig``) with the model at ``checkpoint``
  ("" = the tiny random model):
  ``config.model.tokenizer``, else ``config.data.tokenizer``, else the model's own
  (:func:`own_tokenizer`; when unknown, the checkpoint directory, whose loading then explains).

  ``byte`` with a checkpoint that has its own HF tokenizer is an error: the byte ids mean nothing
  to that model (a silent override once scored a real model 0/6 on passkey)."""
  own = own_tokenizer(checkpoint)
  for section in ("model", "data"):
    spec = str(getattr(config, section).tokenizer or "")
    if not spec:
      continue
    if spec == "byte" and own not in ("", "byte"):
      raise TokenizerChoiceError(
          f"config.{section}.tokenizer='byte' but checkpoint {checkpoint} has its own tokenizer; "
          f"clear it with --config.{section}.tokenizer='' to use the checkpoint's (or name "
          "another tokenizer directory)")
    return spec
  return own or str(checkpoint)


def save_with_model(tok: Tokenizer, out_dir) -> None:
  """Store ``tok`` next to an exported model, so that loading the export finds its own
  tokenizer (HF files, or the byte marker)."""
  if tok.hf is None:
    (Path(out_dir) / BYTE_MARKER).write_text(json.dumps({"tokenizer": "byte"}) + "\n")
  else:
    tok.hf.save_pretrained(str(out_dir))


def tokenizer_of(model_dir: str) -> "Tokenizer":
  """The tokenizer a model directory comes with."""
  spec = own_tokenizer(str(model_dir))
  if not spec:
    raise LongjaxError(f"{model_dir} holds no tokenizer (no tokenizer.json, tokenizer.model or "
                       "tokenizer_config.json): pass --base a model directory that has one")
  return get_tokenizer(spec)
