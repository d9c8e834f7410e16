"""Print command N of the README's "Set-up" block, exactly as written there.

CI runs README command 1 through this script (.ci/run), so the command CI checks is the one a
reader copies: the two cannot drift apart. The block is the first ```bash fence after the
"## Set-up" heading; its commands are its lines that are neither blank nor comments, numbered
from 1.

  python scripts/readme_command.py 1            # prints command 1
  python scripts/readme_command.py 2 --readme OTHER.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Set-up"


class ReadmeError(Exception):
  """The README has no Set-up block, or not that many commands."""


def setup_commands(text: str) -> list[str]:
  """The commands of the first ```bash block under the "## Set-up" heading."""
  lines = text.splitlines()
  start = next((i for i, l in enumerate(lines) if l.startswith(HEADING)), None)
  if start is None:
    raise ReadmeError(f"no '{HEADING}' heading")
  fence = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == "```bash"), None)
  if fence is None or any(lines[i].startswith("## ") for i in range(start + 1, fence)):
    raise ReadmeError(f"no ```bash block under '{HEADING}'")
  end = next((i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```"), None)
  if end is None:
    raise ReadmeError(f"the ```bash block under '{HEADING}' is not closed")
  body = [l.strip() for l in lines[fence + 1:end]]
  if any(l.endswith("\\") for l in body):  # a continued line would be cut in half here
    raise ReadmeError(f"a command under '{HEADING}' continues over lines ('\\'); keep each on one")
  return [l for l in body if l and not l.startswith("#")]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="scripts/readme_command.py", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("n", type=int, help="the command's number in the block, from 1")
  ap.add_argument("--readme", default=str(README), help="the README to read (default: %(default)s)")
  args = ap.parse_args(argv)
  try:
    text = Path(args.readme).read_text(encoding="utf-8")
    commands = setup_commands(text)
    if not 1 <= args.n <= len(commands):
      raise ReadmeError(f"command {args.n} asked, the '{HEADING}' block has {len(commands)}")
  except (OSError, ReadmeError) as e:
    print(f"scripts/readme_command.py: error: {args.readme}: {e}", file=sys.stderr)
    return 1
  print(commands[args.n - 1])
  return 0


if __name__ == "__main__":
  sys.exit(main())
