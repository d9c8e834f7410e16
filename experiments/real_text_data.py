"""Real English text for beacon training, offline: the docstrings of Python's standard library.

Each record is ``{"input": "", "output": chunk}``, so with ``data.loss_on="answer"`` (the
passkey recipe) every token of the chunk is scored: mixed with the passkey documents, the beacons
are asked from the first step to keep the frozen model's language modelling intact, not only to
carry one key. The held-out perplexity text of ``experiments/learn_passkey_real.py ppl``
(``pydoc_data.topics``) is not used here.

  python experiments/real_text_data.py --out runs/smollm2_beacon_data/text.jsonl --count 1500
"""
import argparse
import importlib
import inspect
import json
import pkgutil
import sys
import warnings

SKIP = ("pydoc_data", "idlelib", "tkinter", "turtle", "test", "lib2to3", "ensurepip", "antigravity",
        "this", "__main__")


def module_names():
  """Standard-library modules and their submodules (email.mime.text, xml.dom.minidom, ...)."""
  for top in sorted(m.name for m in pkgutil.iter_modules() if m.name in sys.stdlib_module_names):
    if top.startswith("_") or top in SKIP:
      continue
    yield top
    try:
      pkg = importlib.import_module(top)
    except Exception:  # noqa: BLE001
      continue
    for sub in sorted(m.name for m in pkgutil.walk_packages(getattr(pkg, "__path__", []), top + ".",
                                                            onerror=lambda _: None)):
      if not any(part.startswith("_") or part in SKIP for part in sub.split(".")):
        yield sub


def docstrings():
  """Module, class and function docstrings of the importable stdlib modules, in name order."""
  for name in module_names():
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = importlib.import_module(name)
    except Exception:  # noqa: BLE001 -- platform modules that do not import here
      continue
    doc = inspect.getdoc(mod)
    if doc:
      yield doc
    for attr in sorted(vars(mod)):
      obj = getattr(mod, attr, None)
      if attr.startswith("_") or getattr(obj, "__module__", None) != name:
        continue
      d = inspect.getdoc(obj)
      if d and len(d) > 200:
        yield d


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True)
  ap.add_argument("--count", type=int, default=1500)
  ap.add_argument("--chars", type=int, default=3200, help="characters per chunk (~800 tokens)")
  args = ap.parse_args(argv)
  text = "\n\n".join(docstrings())
  chunks = [text[i:i + args.chars] for i in range(0, len(text) - args.chars, args.chars)]
  chunks = chunks[:args.count]
  with open(args.out, "w") as f:
    for c in chunks:
      f.write(json.dumps({"input": "", "output": c}) + "\n")
  print(f"wrote {len(chunks)} chunks of {args.chars} characters to {args.out} "
        f"({len(text)} characters available)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
