"""Figures: the length x depth heatmap of the passkey / needle papers' figures (matplotlib, Agg)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from longjax.eval.errors import EvalError


def length_label(n: int) -> str:
  """1024 -> "1K", 1500 -> "1.5K", 300 -> "300" (axis ticks, table headers)."""
  if n >= 1000 and n % 1024 == 0:
    return f"{n // 1024}K"
  if n >= 1000:
    return f"{n / 1000:.0f}K" if n % 1000 == 0 else f"{n / 1000:.1f}K"
  return str(n)


def _cell_value(v: float) -> str:
  return f"{v:.2f}".rstrip("0").rstrip(".") if v != 0 else "0"


def _save(fig, path) -> Path:
  """PNG written beside ``path`` and renamed onto it: a killed run leaves no half-written figure."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
  try:
    fig.savefig(tmp, dpi=120, format="png")  # explicit: the temporary name has no .png suffix
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)
  return path


def heatmaps(panels: Sequence[dict], lengths: Sequence[int], depths: Sequence[float], path,
             **kw) -> Path:
  """Several length x depth heatmaps side by side on one colour scale -> PNG at ``path``
  (``heatmaps_figure`` draws them; the same keywords)."""
  fig = heatmaps_figure(panels, lengths, depths, **kw)  # selects the Agg backend first
  import matplotlib.pyplot as plt
  try:
    return _save(fig, path)
  finally:
    plt.close(fig)


def heatmaps_figure(panels: Sequence[dict], lengths: Sequence[int], depths: Sequence[float], *,
                    suptitle: str = "", xlabel: str = "Context length (tokens)",
                    ylabel: str = "Depth (%)", vmin: float = 0.0, vmax: float = 1.0,
                    colorbar_label: str = "", colorbar_ticks: Optional[dict] = None):
  """The matplotlib figure of ``heatmaps``: one panel per entry of ``panels``.

  ``panels``: dicts with ``title`` and ``scores [len(depths), len(lengths)]`` (NaN: not evaluated),
  optionally ``text``: the same shape of strings written in the cells instead of the values.
  Red (``vmin``) to yellow to green (``vmax``), depth 0 % at the top, one column per length, one
  colour bar for all panels (``colorbar_ticks``: ``{value: label}``). Values are written in the
  cells when the grid is small enough to read them.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.colors import LinearSegmentedColormap

  if not panels:
    raise EvalError("heatmaps needs at least one panel")
  cmap = LinearSegmentedColormap.from_list("rdylgn", ["#F0496E", "#EBB839", "#0CD79F"])
  cmap = cmap.with_extremes(bad="#DDDDDD")
  k = len(panels)
  # one panel keeps the single heatmap's proportions; several share the height and the depth axis
  w1 = max(6.0 if k == 1 else 2.6, 0.55 * len(lengths) + (2.5 if k == 1 else 1.2))
  h = max(3.0, 0.42 * len(depths) + 1.8) + (0.4 * (1 + len(suptitle) // 80) if suptitle else 0.0)
  # constrained layout leaves room for the shared colour bar and the titles (tight_layout does not
  # know about a colour bar that spans several axes)
  fig, axes = plt.subplots(1, k, figsize=(w1 * k + (1.2 if k > 1 else 0.0), h), sharey=True,
                           squeeze=False, layout="constrained")
  axes = axes[0]
  im = None
  for a, (ax, p) in enumerate(zip(axes, panels)):
    scores = np.asarray(p["scores"], np.float64)
    if scores.shape != (len(depths), len(lengths)):
      raise EvalError(f"panel {p.get('title', a)!r}: scores of shape {scores.shape}, expected "
                       f"{(len(depths), len(lengths))} (depths x lengths)")
    im = ax.imshow(np.ma.masked_invalid(scores), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                   interpolation="nearest")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels([length_label(int(n)) for n in lengths], rotation=45 if len(lengths) > 8
                       else 0)
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([f"{float(d):g}" for d in depths])
    ax.set_xlabel(xlabel)
    if a == 0:
      ax.set_ylabel(ylabel)
    if p.get("title"):
      ax.set_title(p["title"], fontsize=10 if k > 1 else None)
    text = p.get("text")
    if scores.size <= 240:
      for i in range(scores.shape[0]):
        for j in range(scores.shape[1]):
          s = (text[i][j] if text is not None else
               _cell_value(scores[i, j]) if np.isfinite(scores[i, j]) else "")
          if s:
            ax.text(j, i, s, ha="center", va="center", fontsize=7 if text is None else 8,
                    color="black")
  if suptitle:
    # wrapped to the figure's width (about 0.1 inch per character at the default size): a title
    # wider than the figure is cut off on both sides
    import textwrap
    fig.suptitle("\n".join(textwrap.wrap(suptitle, max(20, int(fig.get_figwidth() / 0.1)))))
  cbar = fig.colorbar(im, ax=list(axes), fraction=0.046 if k == 1 else 0.03, pad=0.02)
  if colorbar_ticks:
    cbar.set_ticks(list(colorbar_ticks))
    cbar.set_ticklabels(list(colorbar_ticks.values()))
  if colorbar_label:
    cbar.set_label(colorbar_label)
  return fig


def heatmap(scores, lengths: Sequence[int], depths: Sequence[float], path, *, title: str = "",
            xlabel: str = "Context length (tokens)", ylabel: str = "Depth (%)",
            vmin: float = 0.0, vmax: float = 1.0) -> Path:
  """``scores [len(depths), len(lengths)]`` (NaN: not evaluated) -> PNG at ``path``.

  Red (0) to yellow to green (1), depth 0 % at the top, one column per length, values written in
  the cells when the grid is small enough to read them.
  """
  return heatmaps([dict(title=title, scores=scores)], lengths, depths, path, xlabel=xlabel,
                  ylabel=ylabel, vmin=vmin, vmax=vmax)
