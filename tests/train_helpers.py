"""Micro training configs for the tests (seconds on CPU)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))


def micro_config(method, workdir, *, steps=4, pretrain=0, save_every=2, mesh=None, batch=4):
  from configs import tiny_beacon, tiny_focus
  c = (tiny_beacon if method == "beacon" else tiny_focus).get_config()
  c.workdir = str(workdir)
  c.model.hidden_size, c.model.intermediate_size = 32, 64
  c.model.num_layers, c.model.num_heads, c.model.head_dim = 2, 4, 8
  c.model.num_kv_heads = 2 if method == "beacon" else 4
  c.model.pretrain.steps = pretrain
  c.model.pretrain.batch = 4
  c.model.pretrain.length = 32
  c.data.synthetic.count = 32
  c.data.synthetic.min_chars, c.data.synthetic.max_chars = 70, 120
  c.data.min_length, c.data.max_length = 64, 128
  if method == "beacon":
    c.beacon.window = c.beacon.stride = 32
    c.beacon.ratios = (2, 4)
    c.train.step_bucket = 4
  else:
    c.focus.local_window = 32
    c.focus.stride = 16
    c.focus.strides = (16,)
    c.focus.prompt_cap = 8
    c.focus.min_local = 4
  c.train.num_steps = steps
  c.train.global_batch = batch
  c.train.save_every = save_every
  c.train.progress = False
  c.train.async_checkpoint = False
  if mesh:
    c.train.mesh.update(mesh)
  return c
