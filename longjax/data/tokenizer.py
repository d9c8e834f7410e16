"""The built-in byte-level tokenizer used by the tiny default configs (no files, no network).

Ids 0/1/2 are pad/BOS/EOS; byte ``b`` is id ``b + 3``. Decoding ignores special ids and replaces
invalid UTF-8 (a tiny model can emit any byte sequence).
"""
from __future__ import annotations


class ByteTokenizer:
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
