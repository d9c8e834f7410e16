"""The lm-evaluation-harness model ``longjax`` (longjax/eval/harness.py) on tiny random models:
requests answered as ``longjax.generate`` and the methods' own NLL answer them, stop strings,
RULER end to end with a local tokenizer, and the bad-input refusals."""
from __future__ import annotations

import types

import jax
import numpy as np
import pytest

pytest.importorskip("lm_eval")

from longjax import methods  # noqa: E402
from longjax.beacon import BeaconConfig  # noqa: E402
from longjax.data.tokenizers import Tokenizer  # noqa: E402
from longjax.eval import harness  # noqa: E402
from longjax.eval.harness import HarnessError, LongjaxLM, Parts  # noqa: E402
from longjax.focus import FocusConfig  # noqa: E402
from longjax.inference.generate import generate  # noqa: E402
from longjax.models.config import ModelConfig  # noqa: E402
from longjax.models.decoder import init_params  # noqa: E402
from longjax.inference.teacher_forcing import teacher_forced_nll  # noqa: E402

from conftest import forward  # noqa: E402
from hf_models import byte_level_tokenizer  # noqa: E402

CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% if not (loop.last and m['role'] == 'assistant') %}</s>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
METHODS = ("plain", "truncation", "beacon", "focus")
TEXT = ("The quick brown fox jumps over the lazy dog; the key is 4127. " * 3)[:150]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  """A byte-level HF tokenizer with a chat template, saved offline (RULER loads it by path)."""
  hf = byte_level_tokenizer()
  hf.chat_template = CHAT
  out = tmp_path_factory.mktemp("tok")
  hf.save_pretrained(out)
  return out


@pytest.fixture(scope="module")
def base(tok_dir):
  from transformers import AutoTokenizer
  tok = Tokenizer(AutoTokenizer.from_pretrained(str(tok_dir)))
  cfg = ModelConfig(family="llama", vocab_size=258, hidden_size=32, intermediate_size=48,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5,
                    bos_token_id=0, eos_token_id=1, max_position_embeddings=8192)
  params = init_params(cfg, 0)
  # larger kernels than the 0.02 init: attention is not uniform and logits are well separated
  params = jax.tree_util.tree_map_with_path(
      lambda p, a: np.asarray(a) * (8.0 if "kernel" in jax.tree_util.keystr(p) else 1.0), params)
  return cfg, params, tok


def make_parts(base, method, **cfg_over) -> Parts:
  cfg, params, tok = base
  cfg = cfg.replace(**cfg_over) if cfg_over else cfg
  reg = methods.get("plain" if method == "truncation" else method)
  settings = {"beacon": BeaconConfig(window=16, stride=16, ratios=(4,), sink_size=0),
              "focus": FocusConfig(local_window=24, chunk_stride=16, prompt_cap=8,
                                   min_len_threshold=0, bos_id=0)}.get(method)
  cfg, params = methods.with_extra_params(reg, cfg, params, settings)
  params = jax.tree.map(jax.numpy.asarray, params)
  return Parts(method, reg.inference_model(cfg, settings), params, cfg, tok, settings,
               window=32 if method == "truncation" else 0)


def req(*args):
  return types.SimpleNamespace(args=args)


@pytest.fixture(scope="module")
def lms(base):
  return {m: LongjaxLM(make_parts(base, m)) for m in METHODS}


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_generate_until_is_longjax_generate(lms, base, method):
  lm = lms[method]
  prompts = [TEXT, TEXT[:70]]
  got = lm.generate_until([req(p, {"until": [], "max_gen_toks": 6}) for p in prompts],
                          disable_tqdm=True)
  tok = base[2]
  for p, g in zip(prompts, got):
    ids = tok.encode(p)
    if method == "truncation":
      ids = ids[:16] + ids[-16:]  # middle truncation to window=32
    want = generate(lm.parts.model, lm.parts.params, [ids], 6, stop_ids=[1]).tokens[0]
    want = [t for t in want if t != 1]
    assert g == tok.decode(want)
    assert len(want) >= 1
  # batched rows of different lengths: the same tokens as one prompt per call
  lm.batch_size = 2
  try:
    assert lm.generate_until([req(p, {"until": [], "max_gen_toks": 6}) for p in prompts],
                             disable_tqdm=True) == got
  finally:
    lm.batch_size = 1


def test_stop_strings_cut_as_lm_eval(lms):
  lm = lms["plain"]
  full = lm.generate_until([req(TEXT, {"until": [], "max_gen_toks": 12})], disable_tqdm=True)[0]
  # a one-token stop string (also a stop id) and a two-token one, both in the text
  singles = [i for i, ch in enumerate(full) if i and len(lm.tok_encode(ch)) == 1]
  assert singles, full
  i = singles[len(singles) // 2]
  one, two = full[i], full[i - 1:i + 1]
  assert lm.stop_ids_for([one]) == sorted({1, lm.tok_encode(one)[0]})
  got = lm.generate_until([req(TEXT, {"until": [one], "max_gen_toks": 12}),
                           req(TEXT, {"until": two, "max_gen_toks": 12}),
                           req(TEXT, {"until": ["zzzz", two], "max_gen_toks": 12})],
                          disable_tqdm=True)
  assert got == [full.split(one)[0], full.split(two)[0], full.split(two)[0]]
  assert got[0] == full[:full.index(one)]


def test_answer_log_resumes_a_stopped_run(lms, tmp_path, monkeypatch):
  """With an answer log, a rerun answers the logged requests from it and generates only the
  rest; what it returns equals an uninterrupted run."""
  from longjax.eval.answer_log import AnswerLog
  lm = lms["plain"]
  reqs = [req(p, {"until": [], "max_gen_toks": 5}) for p in (TEXT, TEXT[:60], TEXT[:90])]
  want = lm.generate_until(reqs, disable_tqdm=True)
  real, rows = lm._generate, []

  def counting(batch, *a, **k):
    rows.extend(map(len, batch))
    return real(batch, *a, **k)

  monkeypatch.setattr(lm, "_generate", counting)
  path = tmp_path / "cell.jsonl"
  try:
    lm.answer_log = AnswerLog(path, "plain")
    assert lm.generate_until(reqs[:2], disable_tqdm=True) == want[:2]  # stopped after two
    assert len(rows) == 2
    lm.answer_log = AnswerLog(path, "plain")  # the rerun
    assert lm.generate_until(reqs, disable_tqdm=True) == want
    assert len(rows) == 3  # only the third request ran again
  finally:
    lm.answer_log = None


def _independent_nll(cfg, params, ids, n):
  logits = forward(cfg, params, np.asarray(ids)[None])[0].astype(np.float64)
  lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  t = len(ids)
  return -sum(lp[i - 1, ids[i]] for i in range(t - n, t))


@pytest.mark.parametrize("method", ("plain", "beacon", "focus"))
def test_loglikelihood_is_teacher_forced_nll(lms, base, method):
  lm = lms[method]
  tok = base[2]
  ctx, cont = TEXT[:100], TEXT[100:130]
  (ll, greedy), = lm.loglikelihood([req(ctx, cont)], disable_tqdm=True)
  c, t = tok.encode(ctx), tok.encode(cont)
  p = lm.parts
  p.model = p.registry.with_room_for(p.model, p.cfg, p.settings, len(c) + len(t))
  logits, state = p.model.prefill(p.params, np.asarray([c], np.int32),
                                  np.array([len(c)], np.int32), len(t))
  want = teacher_forced_nll(p.model.device_plan(state, len(t) - 1), p.params, logits,
                            np.asarray([t]))
  np.testing.assert_allclose(-ll, want.sum(), rtol=2e-5)
  assert not greedy
  if method != "plain":
    return
  # the plain model: also an independent forward of the decoder
  np.testing.assert_allclose(-ll, _independent_nll(p.cfg, p.params, c + t, len(t)), rtol=2e-5)
  # a continuation that greedy decoding produces is greedy
  g = generate(p.model, p.params, [c], 5).tokens[0]
  (_, greedy), = lm.loglikelihood([req(ctx, tok.decode(g))], disable_tqdm=True)
  assert greedy == (tok.encode(ctx + tok.decode(g))[len(c):] == g)


def test_loglikelihood_rolling(lms, base):
  cfg, params, tok = base
  ids = [0] + tok.encode(TEXT)  # the prefix token, then the whole document
  got, = lms["plain"].loglikelihood_rolling([req(TEXT)], disable_tqdm=True)
  np.testing.assert_allclose(-got, _independent_nll(cfg, params, ids, len(ids) - 1), rtol=2e-5)
  # truncation: disjoint windows of W=32 tokens, each read alone
  got, = lms["truncation"].loglikelihood_rolling([req(TEXT)], disable_tqdm=True)
  toks, want, w = tok.encode(TEXT), 0.0, 32
  for start in range(0, len(toks), w):
    pred = toks[start:start + w]
    ctx = [0] + toks[:start] if start == 0 else toks[start - w + len(pred) - 1:start]
    ctx = ctx[-(w + 1 - len(pred)):]
    want += _independent_nll(cfg, params, ctx + pred, len(pred))
  np.testing.assert_allclose(-got, want, rtol=2e-5)


def test_chat_template_continues_gen_prefix(lms):
  lm = lms["plain"]
  hist = [{"role": "user", "content": "q?"}, {"role": "assistant", "content": "The answer is"}]
  assert lm.apply_chat_template(hist, add_generation_prompt=False).endswith("The answer is")
  assert lm.apply_chat_template(hist[:1]) == "<user>q?</s><assistant>"


def test_ruler_end_to_end(lms, tok_dir, monkeypatch):
  import lm_eval
  from lm_eval.tasks.ruler import niah_utils
  gen = niah_utils.generate_samples
  # RULER makes 500 samples per length and limit= keeps the first: make only those (speed)
  monkeypatch.setattr(niah_utils, "generate_samples",
                      lambda *a, **kw: gen(*a, **{**kw, "num_samples": 1}))
  out = lm_eval.simple_evaluate(
      model=lms["plain"], tasks=["niah_single_1"], limit=1, apply_chat_template=True,
      metadata={"tokenizer": str(tok_dir), "max_seq_lengths": [4096]},
      gen_kwargs="max_gen_toks=4")
  res = out["results"]["niah_single_1"]
  assert res["4096,none"] in (0.0, 100.0) or 0.0 <= res["4096,none"] <= 1.0
  assert out["n-samples"]["niah_single_1"]["effective"] == 1


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, msg", [
    (dict(method="beacon", assset="x"), "unknown model_args key 'assset' (did you mean 'asset'?)"),
    (dict(method="focsu"), "did you mean 'focus'?"),
    (dict(method="beacon", asset="smollm2_focus"), "is a focus asset, but method=beacon"),
    (dict(method="focus", asset="smollm2_beacon"), "is a beacon asset, but method=focus"),
    (dict(method="beacon"), "needs asset="),
    (dict(method="truncation", checkpoint="smollm2"), "needs window=W"),
    (dict(method="plain", checkpoint="smollm2", window=8), "applies to method=truncation"),
    (dict(method="plain", checkpoint="/nonexistent/ckpt"), "is not a directory"),
    (dict(method="plain", checkpoint="smollm2", dtype="fp16"), "dtype='fp16'"),
    (dict(method="plain", checkpoint="smollm2", candidate_gate=2), "applies to method=focus"),
    (dict(method="focus", asset="smollm2_focus", candidate_gate="-1"),
     "candidate_gate='-1': must be a finite number >= 0"),
    (dict(method="focus", asset="smollm2_focus", candidate_gate="lots"),
     "candidate_gate='lots': must be a finite number >= 0"),
    (dict(method="beacon", asset="smollm2_beacon", chunk_overlap=8), "applies to method=focus"),
    (dict(method="focus", asset="smollm2_focus", chunk_overlap="-3"),
     "chunk_overlap='-3': must be an integer >= 0"),
    (dict(method="focus", asset="smollm2_focus", gate_threshold="1.5"),
     "gate_threshold='1.5': must be a number in (0, 1]"),
    (dict(method="focus", asset="smollm2_focus", gate_threshold=0),
     "gate_threshold=0: must be a number in (0, 1]"),
    (dict(method="focus", asset="smollm2_focus", gate_gain="-2"),
     "gate_gain='-2': must be a finite number >= 0"),
    (dict(method="plain", checkpoint="smollm2", gate_gain=2), "applies to method=focus"),
    (dict(method="focus", asset="smollm2_focus", gate_peer_gain="nan"),
     "gate_peer_gain='nan': must be a finite number >= 0"),
    (dict(method="beacon", asset="smollm2_beacon", gate_peer_gain=4), "applies to method=focus"),
    (dict(method="focus", asset="smollm2_focus", gate_top_k="0"),
     "gate_top_k=0: must be an integer >= 1"),
    (dict(method="focus", asset="smollm2_focus", gate_top_k=2.5),
     "gate_top_k=2.5: must be an integer >= 1"),
    (dict(method="plain", checkpoint="smollm2", gate_top_k=8), "applies to method=focus"),
    (dict(method="focus", asset="smollm2_focus", chunk_vote="-1"),
     "chunk_vote='-1': must be a finite number >= 0"),
    (dict(method="focus", asset="smollm2_focus", vote_min="1"),
     "vote_min='1': must be a number in [0, 1)"),
    (dict(method="plain", checkpoint="smollm2", chunk_vote=1), "applies to method=focus"),
    (dict(method="focus", asset="smollm2_focus", vote_open="maybe"),
     "vote_open='maybe': give true or false"),
])
def test_bad_model_args_one_line_before_loading(kwargs, msg, monkeypatch):
  monkeypatch.setattr(harness, "load_parts", lambda a: pytest.fail("loaded a model"))
  with pytest.raises(HarnessError, match=None) as e:
    LongjaxLM(**kwargs)
  assert msg in str(e.value) and "\n" not in str(e.value)


def test_candidate_gate_model_arg_is_read_for_focus():
  args = harness.check_model_args(dict(method="focus", asset="smollm2_focus", candidate_gate="4"))
  assert args.candidate_gate == 4.0
  default = harness.check_model_args(dict(method="focus", asset="smollm2_focus"))
  assert default.candidate_gate is None and default.chunk_overlap is None  # the asset's own
  args = harness.check_model_args(dict(method="focus", asset="smollm2_focus", chunk_overlap="32",
                                       gate_threshold="0.5", gate_gain="1.5",
                                       gate_peer_gain="4", gate_top_k="8"))
  assert args.chunk_overlap == 32 and args.gate_threshold == 0.5 and args.gate_gain == 1.5
  assert args.gate_peer_gain == 4.0 and args.gate_top_k == 8
  assert default.gate_top_k is None
  args = harness.check_model_args(dict(method="focus", asset="smollm2_focus", chunk_vote="1",
                                       vote_min="0.5", vote_open="True"))
  assert (args.chunk_vote, args.vote_min, args.vote_open) == (1.0, 0.5, True)
  assert default.chunk_vote is None and default.vote_min is None


def test_prompt_past_capacity_refused_before_running(base, monkeypatch):
  lm = LongjaxLM(make_parts(base, "beacon", max_position_embeddings=48))  # (48-16)*4+16 = 144
  monkeypatch.setattr(lm, "_generate", lambda *a: pytest.fail("generated"))
  with pytest.raises(HarnessError, match=r"request 1 .* more than method=beacon holds \(144"):
    lm.generate_until([req("ab", {"max_gen_toks": 4}), req(TEXT, {"max_gen_toks": 4})],
                      disable_tqdm=True)


def test_ruler_length_without_metric(capsys):
  assert harness.ruler_metric_lengths("niah_single_1")[:2] == [4096, 8192]
  with pytest.raises(HarnessError, match=r"no metric for max_seq_lengths \[2048\]"):
    harness.check_ruler_lengths(["niah_single_1"], [2048, 4096])
  rc = harness.main(["--model", "longjax", "--model_args", "method=plain,checkpoint=smollm2",
                     "--tasks", "ruler_vt", "--metadata", '{"max_seq_lengths":[1000]}'])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err.count("\n") == 0 and "ruler_vt has no metric" in err


def test_without_lm_eval(tmp_path):
  from conftest import run_python
  code = ("import sys; sys.modules['lm_eval'] = None\n"
          "import longjax, longjax.eval\n"
          "from longjax.eval import harness\n"
          "try:\n  harness.LongjaxLM(method='plain')\n"
          "except harness.HarnessError as e:\n  print('ERR', e)\n")
  r = run_python("-c", code)
  assert r.returncode == 0, r.stderr
  assert "ERR" in r.stdout and "pip install -r requirements-eval.txt" in r.stdout


def test_report_resumes_cell_by_cell(tmp_path, capsys):
  """A finished cell is saved and a rerun skips it (cells that load no model: perplexity without
  held-out text, and a cell skipped by flag)."""
  import importlib.util
  from conftest import REPO
  spec = importlib.util.spec_from_file_location("longctx_report",
                                                REPO / "scripts" / "longctx_report.py")
  rep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(rep)
  argv = ["--out", str(tmp_path), "--methods", "plain,beacon", "--tasks", "perplexity,ruler_vt",
          "--ppl_data", "", "--lengths", "4096", "--skip",
          "plain:ruler_vt:4096,beacon:ruler_vt:4096"]
  assert rep.main(argv) == 0
  assert "4 cells, 0 already done" in capsys.readouterr().out
  cells = sorted(p.name for p in (tmp_path / "longctx_cells").glob("*.json"))
  assert cells == ["beacon__perplexity__4096.json", "beacon__ruler_vt__4096.json",
                   "plain__perplexity__4096.json", "plain__ruler_vt__4096.json"]
  table = (tmp_path / "longctx.md").read_text()
  assert "not run: no held-out long text" in table and "not run: too slow" in table
  assert rep.main(argv) == 0
  assert "4 cells, 4 already done" in capsys.readouterr().out
  assert rep.main(argv[:-2] + ["--lengths", "2048"]) == 2  # RULER has no metric for 2048


def test_report_cells_run_at_their_own_lengths():
  """``--cells`` names cells at any length (passkey at 1K) without --lengths; a RULER cell at a
  length with no metric, or a name that is no task, is one error."""
  import importlib.util
  from conftest import REPO
  from longjax.eval.harness import HarnessError
  spec = importlib.util.spec_from_file_location("longctx_report",
                                                REPO / "scripts" / "longctx_report.py")
  rep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(rep)
  args = rep.parse(["--cells", "passkey:1024,niah_single_1:4096"])
  assert args.lengths == [1024, 4096] and args.tasks == ["niah_single_1", "passkey"]
  assert args.pairs == {("passkey", 1024), ("niah_single_1", 4096)}
  with pytest.raises(HarnessError, match="no metric"):
    rep.parse(["--cells", "niah_single_1:1024"])
  with pytest.raises(HarnessError, match="TASK:LENGTH"):
    rep.parse(["--cells", "passkeys:1024"])
  with pytest.raises(HarnessError, match="--max_gen_toks 0: give at least 1 token"):
    rep.parse(["--max_gen_toks", "0"])
  # the default grid: every task at 4K, the long tasks at 8K and 32K; full attention past 8K
  # and FocusLLM's perplexity past 4K recorded as not run
  d = rep.parse([])
  assert ("ruler_vt", 4096) in d.pairs and ("ruler_vt", 8192) not in d.pairs
  assert {("passkey", n) for n in (4096, 8192, 32768)} <= d.pairs
  assert ("focus", "perplexity", 8192) in d.skipped and ("focus", "perplexity", 4096) not in (
      d.skipped)
  assert ("plain", "passkey", 32768) in d.skipped and len(d.skipped) == 5


def test_report_generation_cells_keep_what_was_answered(monkeypatch):
  """A RULER cell keeps each sample's target and the model's text (cut short), never the
  document: the curve shows how a method answers, e.g. one fixed sentence for every question."""
  import importlib.util
  import lm_eval
  from conftest import REPO
  spec = importlib.util.spec_from_file_location("longctx_report",
                                                REPO / "scripts" / "longctx_report.py")
  rep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(rep)
  long_text = "The special magic number is 7654321. " * 20
  fake = {"results": {"niah_single_1": {"4096,none": 0.5}},
          "n-samples": {"niah_single_1": {"effective": 2}},
          "samples": {"niah_single_1": [
              {"doc": {"input": "haystack " * 100}, "target": ["7654321"],
               "resps": [[long_text]]},
              {"doc": {"input": "haystack"}, "target": ["1234567"],
               "resps": [["The pass key is 12345."]]}]}}
  seen = {}

  def simple_evaluate(**kw):
    seen.update(kw)
    return fake

  monkeypatch.setattr(lm_eval, "simple_evaluate", simple_evaluate)
  score, n, extra = rep.run_ruler(object(), "niah_single_1", 4096, 2, "tok")
  answers = extra["answers"]
  assert (score, n) == (0.5, 2) and seen["log_samples"] is True
  assert answers == [{"target": ["7654321"], "answer": long_text[:rep.ANSWER_CHARS]},
                     {"target": ["1234567"], "answer": "The pass key is 12345."}]
  assert len(answers[0]["answer"]) == rep.ANSWER_CHARS < len(long_text)
  assert seen["gen_kwargs"] is None  # the task's own answer length
  rep.run_ruler(object(), "niah_single_1", 4096, 2, "tok", max_gen_toks=24)
  assert seen["gen_kwargs"] == {"max_gen_toks": 24}


def test_heldout_qa_cell_scores_the_generators_heldout_split(monkeypatch):
  """``heldout_qa``: the generator's held-out documents (seed 1000), the question inside the user
  turn; an answer is right when it holds the target (no distractor) in any wording, and the cell
  records how often the answers open with the same words."""
  import importlib.util
  from conftest import REPO
  from longjax.data import haystack
  from longjax.data.tokenizers import get_tokenizer
  spec = importlib.util.spec_from_file_location("longctx_report",
                                                REPO / "scripts" / "longctx_report.py")
  rep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(rep)
  tok = get_tokenizer("byte")
  recs = list(haystack.generate(tok, "heldout", 3, (900, 900), rep.HELDOUT_SEED, chat=False))
  assert {r["haystack"] for r in recs} <= set(haystack.HELDOUT_HAYSTACKS)
  replies = iter([f"It is {recs[0]['target']}.", "The pass key is 12345.",
                  "The pass key is 67890."])
  prompts = []

  class FakeLM:
    parts = type("P", (), {"tokenizer": tok})()

    def apply_chat_template(self, turns):
      return "<user>" + turns[0]["content"] + "<assistant>"

    def generate_until(self, reqs, disable_tqdm=False):
      prompts.append(reqs[0].args)
      return [next(replies)]

  score, n, extra = rep.run_heldout_qa(FakeLM(), 900, 3)
  assert (score, n) == (pytest.approx(1 / 3), 3)
  assert [p[0] for p in prompts] == [f"<user>{r['input']}<assistant>" for r in recs]
  assert all(p[1]["max_gen_toks"] == rep.HELDOUT_QA_TOKENS for p in prompts)
  assert [a["target"] for a in extra["answers"]] == [r["target"] for r in recs]
  assert extra["top_prefix"] == "the pass key is" and extra["top_prefix_share"] == pytest.approx(
      2 / 3, abs=1e-3)
