"""scripts/decision_time.py: the verdict-persistence arithmetic, and a run on a tiny model."""

import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from decision_time import decision_time, verdict_persistence  # noqa: E402


def test_a_verdict_fixed_by_x_t_is_decided_and_an_independent_one_is_not():
    rng = np.random.default_rng(0)
    first = rng.random(4000) < 0.3
    kept = verdict_persistence(first, np.stack([first, first], axis=1))
    assert kept == {"keep_pass": 1.0, "keep_fail": 1.0, "agree": 1.0, "decided": 1.0}
    independent = verdict_persistence(first, rng.random((4000, 2)) < first.mean())
    assert abs(independent["decided"]) < 0.05
    assert independent["keep_pass"] == pytest.approx(0.3, abs=0.04)
    flipped = verdict_persistence(first, ~first[:, None])
    assert flipped["agree"] == 0.0 and flipped["decided"] < -1


def test_undefined_shares_are_nan_not_errors():
    result = verdict_persistence(np.ones(8, dtype=bool), np.ones((8, 1), dtype=bool))
    assert np.isnan(result["keep_fail"]) and np.isnan(result["decided"]) and result["keep_pass"] == 1.0


def test_a_tiny_run_reports_every_task_and_level(tiny_model_dir):
    tasks = decision_time(str(tiny_model_dir), images_per_task=2, num_steps=4, renoises=1, levels=(0.5, 0.01))
    assert len(tasks) == 6
    for row in tasks.values():
        assert set(row["levels"]) == {"0.5", "0.01"}
        assert all(0.0 <= cell["agree"] <= 1.0 for cell in row["levels"].values())
        assert 0.0 <= row["pass_rate"] <= 1.0
