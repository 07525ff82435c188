"""The learning figures the docs state, and `learning_targets.py --docs`'s table of them, agree: every figure in
the table is written where it says (as "65k" or "65,536"), names the commit it was measured at, and is a run
the benchmark knows how to repeat; the verdict a re-run gets is the one its numbers say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
lt = load_benchmark("learning_targets")


@pytest.mark.parametrize("name", sorted(lt.STATED))
def test_each_stated_figure_is_written_where_the_table_says(name):
    steps, where, commit = lt.STATED[name]
    assert name in lt.TARGETS
    assert re.fullmatch(r"[0-9a-f]{7,40}", commit)
    page = ROOT / where.split(",")[0].split("'")[0].split(" ")[0]
    text = page.read_text()
    forms = {f"{steps:,}", f"{steps // 1000}k"} if steps % 1000 == 0 else {f"{steps:,}"}
    assert any(f in text for f in forms), f"{name}: none of {sorted(forms)} in {page}"


def test_a_rerun_that_moved_is_stale_whichever_way(monkeypatch, tmp_path):
    runs = iter([{"steps_to_target": 8_500}, {"steps_to_target": 7_000}, {"steps_to_target": None},
                 {"steps_to_target": 12_000}])
    monkeypatch.setattr(lt, "run_one", lambda name, seed, out: {**next(runs), "best_fitness": 0.0, "wall_s": 0.0})
    monkeypatch.setattr(lt, "STATED", {"a": (8_000, "x", "abc1234"), "b": (8_000, "x", "abc1234"),
                                       "c": (8_000, "x", "abc1234"), "d": (8_000, "x", "abc1234")})
    out = lt.check_stated(["a", "b", "c", "d"], str(tmp_path))
    assert [out[n]["status"] for n in "abcd"] == ["holds", "sooner", "not reached", "later"]
    assert [out[n]["holds"] for n in "abcd"] == [True, False, False, False]
