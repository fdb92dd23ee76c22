"""benchmarks/cut_ranking_sim.py: the item grid's list-scheduling simulation, its fitted model and the regrets."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import cut_ranking_sim as sim  # noqa: E402


def test_the_busiest_sm_takes_the_next_program_where_an_sm_frees_first():
    # 3 SMs, one row tile: items of 4, 3, 2, 2 blocks (+0.5 each) -> 4.5 | 3.5 | 2.5 + 2.5 = 5.0
    items = [(0, 0, 4, -1), (1, 0, 3, -1), (2, 0, 2, -1), (3, 0, 2, -1), (-1, -1, -1, -1)]
    assert sim.busiest_sm(items, 1, sms=3) == pytest.approx(5.0)
    # two row tiles: each item is two programs in a row (row tile fastest): 4.5 | 4.5 | 1.5 + 1.5
    assert sim.busiest_sm([(0, 0, 4, -1), (1, 0, 1, -1)], 2, sms=3) == pytest.approx(4.5)
    assert sim.busiest_sm([(0, 0, 4, -1), (1, 0, 1, -1)], 2, sms=2) == pytest.approx(4.5 + 1.5)   # one each


def test_the_model_fits_the_recorded_item_plans_and_the_later_rankings_regret_less():
    model = sim.fit(sim.load(sim.DEFAULT_RECORDS[:1]))
    assert model["rows"] == 38 and model["mean_error"] < 0.08 and 1.5 < model["per_block"] < 2.2
    reg = sim.regrets(model, sim.random_batches(12, seed=3))
    assert all(x >= -1e-9 for v in reg.values() for x in v)        # never better than the best cut
    assert sum(reg["pairs"]) < sum(reg["spread"])
    assert sum(reg["sim"]) < sum(reg["tail"])      # the planner's simulation against the closed form before
