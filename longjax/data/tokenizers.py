"""Tokenizers for training data: the checkpoint's HF tokenizer (local files only) or the
built-in byte tokenizer of the tiny configs, behind one small interface."""
from __future__ import annotations

from pathlib import Path

from longjax.data.tokenizer import ByteTokenizer


class Tokenizer:
  """``encode(text) -> ids`` (no special tokens), ``bos_id`` / ``eos_id``, ``decode``."""

  def __init__(self, name: str, encode, decode, bos_id, eos_id, vocab_size: int,
               adds_bos: bool):
    self.name, self._encode, self._decode = name, encode, decode
    self.bos_id, self.eos_id, self.vocab_size, self.adds_bos = bos_id, eos_id, vocab_size, adds_bos

  def encode(self, text: str) -> list:
    return list(self._encode(text))

  def decode(self, ids) -> str:
    return self._decode(ids)


def get_tokenizer(spec: str) -> Tokenizer:
  """``"byte"`` or a local directory with HF tokenizer files."""
  if spec == "byte":
    t = ByteTokenizer()
    return Tokenizer("byte", lambda s: t.encode(s), t.decode, t.bos_token_id, t.eos_token_id,
                     t.vocab_size, adds_bos=True)
  if not spec or not Path(spec).is_dir():
    raise FileNotFoundError(f"tokenizer directory {spec!r} does not exist; set "
                            "--config.data.tokenizer=/path/to/hf_model (or 'byte')")
  from transformers import AutoTokenizer
  try:
    t = AutoTokenizer.from_pretrained(spec, local_files_only=True)
  except Exception as e:
    raise FileNotFoundError(f"cannot load a HF tokenizer from {spec}: {type(e).__name__}: {e}") \
        from None
  probe = t("a")["input_ids"]
  adds_bos = bool(probe) and t.bos_token_id is not None and probe[0] == t.bos_token_id
  eos = t.eos_token_id
  return Tokenizer(spec, lambda s: t(s, add_special_tokens=False)["input_ids"],
                   lambda ids: t.decode(list(ids), skip_special_tokens=True), t.bos_token_id,
                   eos, len(t), adds_bos)
