"""Scorers against values computed by hand (pure Python, no model)."""
import pytest

from longjax.eval import scorers as S
from longjax.eval.infbench import choice_letter
from longjax.eval.models import middle_truncate


def test_normalize_and_qa_f1():
  assert S.normalize_answer("The Cat, sat!  on a mat.") == "cat sat on mat"
  assert S.normalize_answer("An apple-pie") == "applepie"
  # pred -> [cat, sat, on, mat], ref "a cat on a mat" -> [cat, on, mat]: 3 shared,
  # P = 3/4, R = 3/3, F1 = 2 * 0.75 / 1.75 = 6/7.
  assert S.qa_f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
  assert S.qa_f1("Paris", "paris.") == 1.0
  assert S.qa_f1("dog", "cat") == 0.0
  # multiset overlap: pred [a1, a1, b], ref [a1, c] -> 1 shared; P = 1/3, R = 1/2, F1 = 0.4
  assert S.qa_f1("x x y", "x z") == pytest.approx(0.4)
  # best over answers (LongBench: max over the answer list)
  assert S.best_of(S.qa_f1, "new york city", ["boston", "New York"]) == pytest.approx(0.8)


def test_rouge_l_counts_distinct_words():
  # ref words: the cat sat on the mat -> 5 distinct (m = 5); pred 3 distinct (n = 3); LCS 3.
  r = S.rouge_l("the cat sat", "the cat sat on the mat")
  assert (r["p"], r["r"], r["f"]) == pytest.approx((1.0, 0.6, 0.75))
  # case-sensitive, punctuation stays attached to words
  assert S.rouge_l("The Cat sat", "the cat sat")["f"] == pytest.approx(1 / 3)
  assert S.rouge_l("cat, dog!", "cat dog")["f"] == 0.0
  assert S.rouge_l("", "cat")["f"] == 0.0


def test_rouge_l_summary_level_union():
  # ref sentences "a b" / "c d e"; pred sentences "a b c" / "d e": union LCS hits 2 + 3 = 5,
  # m = n = 5 distinct words -> 1.0 although no single sentence pair matches fully.
  assert S.rouge_l("a b c. d e", "a b. c d e")["f"] == pytest.approx(1.0)
  # ref "z y x" then "x z", pred "x y z": the first reference sentence's LCS (length 1, ties
  # resolved by dropping prediction words) is {x}; the second adds {x, z} - {x} = {z}:
  # hits 2, m = n = 3 -> 2/3.
  assert S.rouge_l("x y z", "z y x. x z")["f"] == pytest.approx(2 / 3)
  # tie-break under set counting: ref "a b a", pred "a a a b": LCS length 2, the one read
  # back is "a a" -> {a}: hits 1, m = n = 2 -> 0.5 (the other order gives {a, b} -> 1.0).
  assert S.rouge_l("a a a b", "a b a")["f"] == pytest.approx(0.5)
  assert S.rouge_l("a b a", "a a a b")["f"] == pytest.approx(1.0)
  # a whitespace-only piece between two dots is one empty word: pred "d . . e a a" has
  # pieces [d], [""], [e a a] -> n = 4 distinct; ref "cat a" m = 2; hits {a} -> R 1/2, P 1/4.
  r = S.rouge_l("d . . e a a", "cat a")
  assert (r["p"], r["r"], r["f"]) == pytest.approx((0.25, 0.5, 1 / 3))


def test_needle_recall():
  from longjax.eval.config import NEEDLE
  ref = NEEDLE.strip()
  # 21 words, 19 distinct ("in" and "a" repeat); "sitting in Dolores Park" hits 4 of them.
  assert S.rouge_l_recall("sitting in Dolores Park", ref) == pytest.approx(4 / 19)
  assert S.rouge_l_recall(ref, ref) == pytest.approx(1.0)


def test_fuzz_ratio():
  # difflib: "123" then "4" match -> M = 4, 2M/T = 8/10
  assert S.fuzz_ratio("12345", "12354") == 80
  assert S.fuzz_ratio("same", "same") == 100 and S.fuzz_ratio("", "") == 100
  assert S.fuzz_ratio("a", "") == 0
  assert S.fuzz_ratio("abc", "ABC") == 0  # no case folding
  assert S.fuzz_ratio("hello world", "hello") == 62  # 2*5/16 = 62.5 -> round half to even
  assert S.fuzz_ratio("aab", "abb") == 67  # M = 2: 2*2/6 = 66.7
  # difflib takes the longest block first: "aa" (a[0:2] = b[2:4]) blocks the LCS "aaa":
  # M = 2 -> 50; the exact indel similarity uses LCS = 3 -> 75.
  assert S.fuzz_ratio("aaaa", "abaa") == 50
  assert S.fuzz_ratio("aaaa", "abaa", method="indel") == pytest.approx(75.0)
  with pytest.raises(ValueError):
    S.fuzz_ratio("a", "b", method="levenshtein")


def test_code_sim():
  # the first line with no ` # // is "print(x)"; difflib M = 7 of T = 16 -> 87.5 -> 88
  assert S.code_sim("```python\n# a comment\nprint(x)\nmore", "print(y)") == pytest.approx(0.88)
  assert S.code_sim("\n\nreturn a // b\nreturn a", "return a") == 1.0
  assert S.code_sim("# only comments", "x = 1") == 0.0


def test_classification():
  classes = ["Human", "Location", "Entity"]
  assert S.classification("Human being", "Human", all_classes=classes) == 1.0
  assert S.classification("Location or Human", "Human", all_classes=classes) == 0.5
  assert S.classification("Entity", "Human", all_classes=classes) == 0.0
  # the published removal loop: matched [ab, a, b, abc] for reference "abc": "ab" is removed
  # and "a" is not examined, "b" is removed and "abc" is not examined -> [a, abc] -> 1/2
  # (removing every proper substring would give 1.0).
  assert S.classification("abc", "abc", all_classes=["ab", "a", "b", "abc"]) == 0.5
  with pytest.raises(ValueError, match="all_classes"):
    S.classification("x", "y")


def test_passkey_and_infbench_scorers():
  assert S.first_int("The pass key is 12345. 678") == "12345"
  assert S.first_int("no digits") == ""
  assert S.first_int_match(" 71432 is it", "71432") == 1.0
  assert S.first_int_match("key: 012", "12") == 0.0
  assert S.kv_match('The value is: "abc-123".', "abc-123") == 1.0
  assert S.kv_match("abc-1234", "abc-123") == 0.0
  assert S.choice_match(" B. The dog", "B") == 1.0
  assert S.choice_match("C", "B") == 0.0
  assert S.choice_match("", "B") == 0.0
  assert S.choice_match("The answer is: B", "B") == 1.0  # after the "answer is:" prefix
  assert S.choice_match("I think it is B", "B") == 1.0  # first single-letter word
  assert S.choice_match("the dog", "B", "The dog barked") == 0.0  # not a substring (case)
  assert S.choice_match("dog barked", "B", "The dog barked") == 1.0
  assert choice_letter({"answer": ["cat"], "options": ["dog", "cat", "cow", "pig"]}) == "B"


def test_middle_truncate():
  assert middle_truncate(list(range(10)), 4) == [0, 1, 8, 9]
  assert middle_truncate(list(range(10)), 5) == [0, 1, 7, 8, 9]
  assert middle_truncate([1, 2], 4) == [1, 2]
