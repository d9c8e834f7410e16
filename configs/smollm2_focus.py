"""FocusLLM on frozen SmolLM2-135M-Instruct (the real-model learning campaign, CPU-sized).

Local window and chunk size 256 (the beacon campaign's W, so the two methods compare at the same
window), candidate q/k/v/o trained from the official init (copies of the base projections),
frozen base, fp32 master weights. The last <= 128 local tokens (the dynamic prompt) are appended
to every chunk. Objectives (official, docs/focusllm.md §5): continuation or repetition with the
loss on one target token per sample; passkey documents (input/output records) take the answer
objective instead: the target is a digit of the answer, the local context ends just before it
(longjax.data.pipeline.focus_indices); copy-task records (input/output) likewise target a token
of the copied continuation. Data: the beacon campaign's offline prose, copy and passkey files
(configs/smollm2_beacon.py says how to write them); held out: pydoc_data.topics.

  python train.py --config=configs/smollm2_focus.py          # rerun the same command to resume
  # continue from the committed asset on a fresh machine (fresh optimizer):
  python train.py --config=configs/smollm2_focus.py --config.train.init_from=assets/smollm2_focus
  python -m longjax.focus.asset --workdir runs/focus_campaign/run --out assets/smollm2_focus \
      --overwrite
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "focus"
  c.workdir = "runs/focus_campaign/run"
  c.seed = 0
  c.model = common.real_model("HuggingFaceTB/SmolLM2-135M-Instruct", checkpoint="smollm2",
                              dtype="float32", param_dtype="float32")
  c.focus = ml_collections.ConfigDict(dict(local_window=256, stride=256, strides=(256,),
                                           prompt_cap=128, param=("q", "k", "v", "o"),
                                           min_len_threshold=0, min_local=30,
                                           objective="answer", steps=1,
                                           dense_share=0.0, candidate_gate=0.0,
                                           gate_threshold=1.0, gate_gain=0.0, gate_peer_gain=0.0,
                                           gate_top_k=1, chunk_overlap=0, chunk_vote=0.0,
                                           vote_min=0.0, vote_open=False))
  c.data = common.data_defaults(sources="jsonl:runs/campaign/prose.jsonl,"
                                        "jsonl:runs/campaign/copy.jsonl,"
                                        "jsonl:runs/campaign/passkey.jsonl",
                                min_length=300, max_length=1400)
  # lr 2e-4 (official: 5e-5 over far more steps): the overfit check (16 twin documents) learned
  # at 3e-4 in < 100 steps; the schedule decays over 400 steps, what a CPU session can run
  c.train = common.train_defaults(num_steps=400, global_batch=8, lr=2e-4, warmup_steps=10,
                                  save_every=25, keep=40, log_every=1, progress=False)
  from longjax.eval.config import eval_config  # noqa: E402
  c.eval = eval_config("focus", preset="tiny")
  return c
