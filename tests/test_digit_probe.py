"""experiments/digit_probe.py: the per-digit reading of a needle answer (ranks among the digits)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import digit_probe as dp  # noqa: E402

V = 20
DIGITS = np.arange(10, 20)  # token 10 + d is digit d; 1 is the space, 2 the full stop


def _row(best, second=None):
  r = np.full(V, -9.0)
  r[best] = 0.0
  if second is not None:
    r[second] = -1.0
  return r


def test_ranks_among_digits_greedy_and_summary():
  # prompt of 3 tokens, answer " 4 7": rows 2, 3, 4 predict " ", "4", "7"
  lp = dp.log_softmax(np.stack([_row(0), _row(0), _row(1), _row(14),
                                _row(2, second=17)]))  # after "4": "." first, "7" the top digit
  dec = lambda i: {1: " ", 2: "."}.get(i, str(i - 10))  # noqa: E731
  per = dp.read_digits(lp, 3, [1, 14, 17], DIGITS, dec)
  assert [c["rank"] for c in per] == [None, 1, 1]
  assert [c["greedy"] for c in per] == [" ", "4", "."]
  assert per[1]["p"] > 0.99 and 0.2 < per[2]["p"] < 0.3
  # a digit under three others ranks 4
  lp2 = lp.copy()
  lp2[4, [15, 16, 18]] = -0.5
  assert dp.read_digits(lp2, 3, [1, 14, 17], DIGITS, dec)[2]["rank"] == 4
  rows = [dict(digits=per), dict(digits=dp.read_digits(lp2, 3, [1, 14, 17], DIGITS, dec))]
  s = dp.summarise(rows)
  assert [x["digit"] for x in s] == [1, 2]
  assert s[0]["first_among_digits"] == 2 and s[1]["first_among_digits"] == 1
  assert s[1]["greedy"] == ".." and s[0]["n"] == 2


def test_bad_input_is_one_line_before_the_model_loads(tmp_path, capsys):
  (tmp_path / "empty").mkdir()
  (tmp_path / "beacon.json").write_text('{"beacon_stride": 256}')
  for argv, said in ((["--asset", str(tmp_path / "none")], "no such directory"),
                     (["--asset", str(tmp_path / "empty"), "--ratio", "4"], "no beacon.json"),
                     (["--asset", str(tmp_path), "--samples", "0"], "--samples 0: give at least"),
                     (["--method", "plain", "--ratio", "4"], "--method plain has none"),
                     (["--asset", str(tmp_path), "--ratio", "3"], "stride (256)"),
                     (["--asset", str(tmp_path), "--ratio", "0"], "divisor of the asset's stride")):
    assert dp.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
