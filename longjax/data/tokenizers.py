"""Tokenizers for training data: the checkpoint's HF tokenizer (local files only) or the
built-in byte tokenizer of the tiny configs, behind one small interface.

:func:`choose_tokenizer` is the one rule train.py and eval.py share for *which* tokenizer a run
uses: an explicit ``config.model.tokenizer`` / ``config.data.tokenizer``, else the model's own.
"""
from __future__ import annotations

import json
from pathlib import Path

from longjax.data.tokenizer import ByteTokenizer
from longjax.errors import LongjaxError


class Tokenizer:
  """``encode(text) -> ids`` (no special tokens), ``bos_id`` / ``eos_id``, ``decode``."""

  def __init__(self, name: str, encode, decode, bos_id, eos_id, vocab_size: int,
               adds_bos: bool, hf=None):
    self.name, self._encode, self._decode, self.hf = name, encode, decode, hf
    self.bos_id, self.eos_id, self.vocab_size, self.adds_bos = bos_id, eos_id, vocab_size, adds_bos

  def encode(self, text: str) -> list:
    return list(self._encode(text))

  def decode(self, ids) -> str:
    return self._decode(ids)


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
    t = ByteTokenizer()
    return Tokenizer("byte", lambda s: t.encode(s), t.decode, t.bos_token_id, t.eos_token_id,
                     t.vocab_size, adds_bos=True)
  if not spec or not Path(spec).is_dir():
    raise FileNotFoundError(f"tokenizer directory {spec!r} does not exist; set "
                            "--config.data.tokenizer=/path/to/hf_model (or 'byte')")
  check_tokenizer_dir(spec)
  from transformers import AutoTokenizer
  try:
    t = AutoTokenizer.from_pretrained(spec, local_files_only=True)
  except Exception as e:
    raise FileNotFoundError(f"cannot load a HF tokenizer from {spec}: {type(e).__name__}: {e}; "
                            "put the tokenizer files there or set --config.data.tokenizer "
                            "(a HF model dir, or 'byte')") from None
  check_vocab(t, spec)
  probe = t("a")["input_ids"]
  adds_bos = bool(probe) and t.bos_token_id is not None and probe[0] == t.bos_token_id
  eos = t.eos_token_id
  return Tokenizer(spec, lambda s: t(s, add_special_tokens=False)["input_ids"],
                   lambda ids: t.decode(list(ids), skip_special_tokens=True), t.bos_token_id,
                   eos, len(t), adds_bos, hf=t)


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


def _field(config, section: str, name: str):
  sec = config.get(section) if hasattr(config, "get") else getattr(config, section, None)
  if sec is None:
    return ""
  return (sec.get(name) if hasattr(sec, "get") else getattr(sec, name, "")) or ""


def choose_tokenizer(config, checkpoint: str) -> str:
  """The tokenizer spec of a run with the model at ``checkpoint`` ("" = the tiny random model):
  ``config.model.tokenizer``, else ``config.data.tokenizer``, else the model's own
  (:func:`own_tokenizer`; when unknown, the checkpoint directory, whose loading then explains).

  ``byte`` with a checkpoint that has its own HF tokenizer is an error: the byte ids mean nothing
  to that model (a silent override once scored a real model 0/6 on passkey)."""
  own = own_tokenizer(checkpoint)
  for section in ("model", "data"):
    spec = str(_field(config, section, "tokenizer"))
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
  if tok.name == "byte":
    (Path(out_dir) / BYTE_MARKER).write_text(json.dumps({"tokenizer": "byte"}) + "\n")
  elif tok.hf is not None:
    tok.hf.save_pretrained(str(out_dir))
