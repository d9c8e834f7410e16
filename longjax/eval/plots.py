"""Figures: the length x depth heatmap of the passkey / needle papers' figures (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def _length_label(n: int) -> str:
  if n >= 1000 and n % 1024 == 0:
    return f"{n // 1024}K"
  if n >= 1000:
    return f"{n / 1000:.0f}K" if n % 1000 == 0 else f"{n / 1000:.1f}K"
  return str(n)


def heatmap(scores, lengths: Sequence[int], depths: Sequence[float], path, *, title: str = "",
            xlabel: str = "Context length (tokens)", ylabel: str = "Depth (%)",
            vmin: float = 0.0, vmax: float = 1.0) -> Path:
  """``scores [len(depths), len(lengths)]`` (NaN: not evaluated) -> PNG at ``path``.

  Red (0) to yellow to green (1), depth 0 % at the top, one column per length, values written in
  the cells when the grid is small enough to read them.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.colors import LinearSegmentedColormap

  scores = np.asarray(scores, np.float64)
  cmap = LinearSegmentedColormap.from_list("rdylgn", ["#F0496E", "#EBB839", "#0CD79F"])
  cmap = cmap.with_extremes(bad="#DDDDDD")
  w = max(6.0, 0.55 * len(lengths) + 2.5)
  h = max(3.0, 0.42 * len(depths) + 1.8)
  fig, ax = plt.subplots(figsize=(w, h))
  im = ax.imshow(np.ma.masked_invalid(scores), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                 interpolation="nearest")
  ax.set_xticks(range(len(lengths)))
  ax.set_xticklabels([_length_label(int(n)) for n in lengths], rotation=45 if len(lengths) > 8
                     else 0)
  ax.set_yticks(range(len(depths)))
  ax.set_yticklabels([f"{float(d):g}" for d in depths])
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if title:
    ax.set_title(title)
  if scores.size <= 240:
    for i in range(scores.shape[0]):
      for j in range(scores.shape[1]):
        if np.isfinite(scores[i, j]):
          ax.text(j, i, f"{scores[i, j]:.2f}".rstrip("0").rstrip(".") if scores[i, j] != 0 else "0",
                  ha="center", va="center", fontsize=7, color="black")
  fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
  fig.tight_layout()
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
