"""Which tokenizer a run uses (train.py and eval.py share ``choose_tokenizer``): the model's own
unless the config names one; ``byte`` with a checkpoint that has its own tokenizer is an error."""
import pytest

from train_helpers import micro_config

from longjax.data.tokenizers import (BYTE_MARKER, TokenizerChoiceError, choose_tokenizer,
                                     get_tokenizer)
from longjax.eval import EvalError
from hf_models import byte_level_tokenizer
from longjax.eval.models import build_method
from longjax.run_config import from_config
from longjax.train import loop


def _hf_tokenizer():
  return byte_level_tokenizer()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A tiny LLaMA HF checkpoint (vocab 320) with its own tokenizer files."""
  from hf_models import save_tiny
  _, out = save_tiny(tmp_path_factory.mktemp("ckpt"), "llama2", bos_token_id=0, eos_token_id=1)
  _hf_tokenizer().save_pretrained(out)
  return out


def _beacon(workdir, **model):
  c = micro_config("beacon", workdir, steps=1)
  c.model.update(model)
  return c


def test_tiny_default_is_byte(tmp_path):
  c = _beacon(tmp_path)
  assert c.data.tokenizer == ""  # the tiny configs no longer name it: the tiny model implies it
  assert choose_tokenizer(from_config(c), "") == "byte"
  c.eval.method = "plain"
  b = build_method(from_config(c))
  assert not b.tokenizer.hf and b.cfg.vocab_size == 259


def test_default_picks_the_checkpoint_tokenizer(tmp_path, hf_dir):
  c = _beacon(tmp_path, checkpoint=str(hf_dir))
  assert choose_tokenizer(from_config(c), str(hf_dir)) == str(hf_dir)
  c.eval.method = "plain"
  assert build_method(from_config(c)).tokenizer.vocab_size == 258
  t = loop.Trainer(from_config(c))
  t.setup()
  assert t.tokenizer.name == str(hf_dir) and t.tokenizer.bos_id == 0
  # the export carries the tokenizer, so eval.py on it finds the model's own again
  out = t.export()
  assert (out / "tokenizer.json").exists()
  c2 = _beacon(tmp_path / "e")
  c2.eval.checkpoint, c2.eval.method = str(out), "plain"
  assert build_method(from_config(c2)).tokenizer.hf


def test_byte_with_a_checkpoint_tokenizer_is_an_error(tmp_path, hf_dir):
  c = _beacon(tmp_path, checkpoint=str(hf_dir))
  c.data.tokenizer = "byte"
  msg = f"config.data.tokenizer='byte' but checkpoint {hf_dir} has its own tokenizer; clear it " \
        "with --config.data.tokenizer=''"
  with pytest.raises(TokenizerChoiceError) as e:
    choose_tokenizer(from_config(c), str(hf_dir))
  assert msg in str(e.value)
  with pytest.raises(loop.TrainingError, match="has its own tokenizer"):
    loop.Trainer(from_config(c)).setup()
  c.eval.method = "plain"
  with pytest.raises(EvalError, match="has its own tokenizer"):
    build_method(from_config(c))


def test_explicit_tokenizer_wins_but_must_fit_the_vocab(tmp_path, hf_dir):
  from hf_models import save_tiny
  _, small = save_tiny(tmp_path, "llama2", vocab_size=200)  # no tokenizer files of its own
  c = _beacon(tmp_path, checkpoint=str(small))
  assert choose_tokenizer(from_config(c), str(small)) == str(small)  # unknown: loading it explains
  c.data.tokenizer = "byte"
  assert choose_tokenizer(from_config(c), str(small)) == "byte"  # no own tokenizer: no conflict
  c.data.tokenizer = str(hf_dir)  # 258 ids > 200
  assert choose_tokenizer(from_config(c), str(small)) == str(hf_dir)
  c.eval.method = "plain"
  with pytest.raises(EvalError, match="258 ids but the model's vocabulary is 200"):
    build_method(from_config(c))


def test_byte_run_export_keeps_byte(tmp_path):
  """A tiny (byte) run's export has no HF files; its marker keeps eval on the byte tokenizer."""
  c = _beacon(tmp_path)
  t = loop.Trainer(from_config(c))
  t.setup()
  out = t.export()
  assert (out / BYTE_MARKER).exists()
  assert choose_tokenizer(from_config(c), str(out)) == "byte"
  c.eval.method = "plain"
  b = build_method(from_config(c))  # eval's default checkpoint: {workdir}/export_hf
  assert b.description.startswith(f"plain {out}") and not b.tokenizer.hf
  # the tiny config's training ids are the byte tokenizer's, as when it named "byte"
  assert get_tokenizer(choose_tokenizer(from_config(c), "")).encode("ab") == [100, 101]
