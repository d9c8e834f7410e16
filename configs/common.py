"""Shared defaults of the training configs (each config file calls these and overrides)."""
import ml_collections


def train_defaults(**kw):
  t = dict(num_steps=0, num_epochs=1, global_batch=8, grad_accum=1, lr=5e-5, end_lr=0.0,
           warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0,
           remat=True, step_bucket=1, log_every=1, save_every=1000, keep=3,
           async_checkpoint=True, export=True, distributed="auto", impl="auto",
           tensorboard=True, progress=True,
           # beacon: "official" (last window without beacons) or "inference" (as generation sees it)
           layout="official",
           # a committed asset (longjax.beacon.asset) whose method tensors start this run
           init_from="")
  t.update(kw)
  mesh = t.pop("mesh", dict(data=-1, fsdp=1, tensor=1))
  # A multi-process run (longjax.train.distributed): empty / 0 / -1 = from $JAX_COORDINATOR_ADDRESS,
  # $JAX_NUM_PROCESSES, $JAX_PROCESS_ID, else detected by JAX (TPU pod, SLURM, Open MPI).
  cluster = t.pop("cluster", dict(coordinator_address="", num_processes=0, process_id=-1))
  # data.loss_on="distill" or a source "...@distill": the teacher's top_k tokens per position;
  # alpha > 0 weights tokens that need far context more (longjax.tasks.DistillSettings)
  distill = t.pop("distill", dict(top_k=32, alpha=0.0))
  cd = ml_collections.ConfigDict(t)
  cd.mesh = ml_collections.ConfigDict(mesh)
  cd.cluster = ml_collections.ConfigDict(cluster)
  cd.distill = ml_collections.ConfigDict(distill)
  return cd


def data_defaults(**kw):
  # tokenizer "": the model's own (the checkpoint's files; byte for the tiny model). Naming one
  # overrides it ("byte" with a checkpoint that has its own tokenizer is an error).
  d = dict(sources="", tokenizer="", text_field="text", tfds_data_dir="", tfds_split="train",
           min_length=0, max_length=1 << 30, append_eos=True, add_bos="auto", max_per_source=0,
           loss_on="all")
  synthetic = kw.pop("synthetic", dict(count=256, min_chars=256, max_chars=512, digits=5))
  d.update(kw)
  cd = ml_collections.ConfigDict(d)
  cd.synthetic = ml_collections.ConfigDict(synthetic)
  return cd


def debug_defaults():
  return ml_collections.ConfigDict(dict(kill_after_step=-1, nan_at_step=-1))


def real_model(name, **kw):
  """A released checkpoint: ``checkpoint`` must be given on the command line."""
  m = dict(name=name, checkpoint="", dtype="bfloat16", param_dtype="bfloat16", remat=True)
  m.update(kw)
  return ml_collections.ConfigDict(m)


def tiny_model(family, num_kv_heads, pretrain_sources):
  """The embedded default: a tiny random base (byte tokenizer) pretrained on generated text."""
  m = ml_collections.ConfigDict(dict(
      checkpoint="",  # empty: a tiny model with the byte tokenizer, pretrained as below
      family=family, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
      num_kv_heads=num_kv_heads, head_dim=16, dtype="float32", param_dtype="", remat=False))
  m.pretrain = ml_collections.ConfigDict(dict(
      steps=150, batch=16, lr=3e-3, length=64, warmup_steps=15, weight_decay=0.0, save_every=0,
      sources=pretrain_sources, min_length=32, max_length=1 << 30))
  m.pretrain.synthetic = ml_collections.ConfigDict(dict(count=512, min_chars=128, max_chars=250,
                                                        digits=5))
  return m
