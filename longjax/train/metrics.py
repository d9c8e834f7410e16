"""Run outputs: ``metrics.jsonl`` (one JSON object per logged step), TensorBoard (when a writer
is importable), and the progress line."""
from __future__ import annotations

import json
import math
from pathlib import Path


def _tb_writer(logdir):
  for mod in ("tensorboardX", "torch.utils.tensorboard"):
    try:
      m = __import__(mod, fromlist=["SummaryWriter"])
      return m.SummaryWriter(str(logdir))
    except Exception:  # noqa: BLE001 - optional
      continue
  return None


class MetricsWriter:
  def __init__(self, workdir, *, tensorboard: bool = True, primary: bool = True):
    self.path = Path(workdir) / "metrics.jsonl"
    self.primary = primary
    self.tb = _tb_writer(Path(workdir) / "tensorboard") if (tensorboard and primary) else None

  def truncate_after(self, step: int):
    """Drop lines of steps after ``step`` (written after the checkpoint we resume from)."""
    if not self.primary or not self.path.exists():
      return
    keep = []
    for line in self.path.read_text().splitlines():
      try:
        if json.loads(line).get("step", 0) <= step:
          keep.append(line)
      except json.JSONDecodeError:
        continue  # a line cut by a kill
    self.path.write_text("".join(l + "\n" for l in keep))

  def reset(self):
    if self.primary and self.path.exists():
      self.path.unlink()

  def write(self, rec: dict):
    if not self.primary:
      return
    with self.path.open("a") as f:
      f.write(json.dumps(rec, allow_nan=True) + "\n")
      f.flush()
    if self.tb is not None:
      for k, v in rec.items():
        if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
          self.tb.add_scalar(k, v, rec["step"])
      self.tb.flush()

  def close(self):
    if self.tb is not None:
      self.tb.close()


def read_metrics(workdir) -> list:
  p = Path(workdir) / "metrics.jsonl"
  return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
