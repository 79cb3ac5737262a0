"""scripts/bench_learning.py: the smoke suite (every algorithm and baseline, 1 seed, 1 step) writes a report
of the documented form and its plots, and a second call resumes instead of training again. No timing or
score thresholds: the smoke run's numbers mean nothing."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from bench_suite import SUITES, Suite, resolve  # noqa: E402
from learning_report import first_crossing  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMOKE = yaml.safe_load(Path("configs/bench/smoke.yaml").read_text())


def run_bench(out: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        str(SCRIPTS / "bench_learning.py"),
        "--suite",
        "smoke",
        "--out",
        str(out),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_the_smoke_suite_covers_every_algorithm_recipe():
    from flowrl.algorithms import ALGORITHMS

    algorithms = {
        yaml.safe_load(Path(path).read_text())["algorithm"]["name"] for path in SMOKE["recipes"].values()
    }
    assert algorithms == set(ALGORITHMS)


@pytest.mark.parametrize("path", sorted(SUITES.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_suite_fits_its_recipes_to_its_budget(path):
    """Each suite's recipes are valid configs whose images per step divide the budget and the cadence."""
    suite = Suite.load(path)
    for name in suite.recipes:
        recipe = resolve(suite, name)
        budget = suite.recipe_images.get(name, suite.images)
        assert recipe.steps * recipe.images_per_step == budget and recipe.eval_every >= 1


def test_first_crossing_is_linear_between_evaluations():
    curve = [
        {"images": 0, "seconds": 0.0, "held_out": 0.50},
        {"images": 100, "seconds": 10.0, "held_out": 0.54},
        {"images": 200, "seconds": 30.0, "held_out": 0.58},
    ]
    assert first_crossing(curve, 0.55, "images") == pytest.approx(125.0)
    assert first_crossing(curve, 0.55, "seconds") == pytest.approx(15.0)
    assert first_crossing(curve, 0.60, "images") is None
    assert first_crossing(curve, 0.45, "images") == 0.0


def test_the_smoke_benchmark_writes_its_report_and_resumes(tmp_path):
    out = tmp_path / "bench"
    run_bench(out)
    report = json.loads((out / "bench_learning.json").read_text())
    assert {
        "suite",
        "command",
        "date",
        "machine",
        "seeds",
        "images_per_run",
        "baselines",
        "algorithms",
    } <= set(report)
    assert report["suite"] == "smoke" and report["seeds"] == [0] and report["images_per_run"] == 64
    assert set(report["algorithms"]) == set(SMOKE["recipes"])
    assert set(report["baselines"]) == {"shapes-base", "shapes-meanflow"}
    for baseline in report["baselines"].values():
        assert set(baseline["cfg"]) == {"1", "3"} and set(baseline["best_of"]) == {"4", "8"}
        for n, scores in baseline["best_of"].items():
            assert scores["nfe_per_image"] == int(n) * baseline["num_steps"]
            assert 0.0 <= scores["geneval/overall"] <= scores["pass_at_n"] <= 1.0
            assert scores["generation_seconds_per_image"] > 0
    for name, summary in report["algorithms"].items():
        assert summary["seeds"] == [0] and summary["steps"] * summary["images_per_step"] == 64, name
        assert [point["images"] for point in summary["curve"]] == [0, 64], name
        assert summary["curve"][0]["held_out"][0] == pytest.approx(
            report["baselines"][summary["base_model"]]["cfg"]["1"]["geneval/overall"]
        )
        assert set(summary["per_task"]) >= {"geneval/overall", "geneval/counting", "geneval/color_attr"}
        assert 0.0 <= summary["held_out"][0] <= 1.0 and summary["drift"][0] >= 0.0
        assert len(summary["runs"]["0"]["reward_curve"]) == 1
        # the drift from the base is logged by the NFT family, not by the GRPO family, CRD or RAFT
        assert len(summary["runs"]["0"]["reference_mse_curve"]) == (1 if "nft" in name else 0), name
        for target in ("0.05", "0.1"):
            entry = summary["time_to_target"][target]
            assert entry["of"] == 1 and entry["reached"] in (0, 1)
            assert f"images_ratio_to_{report['reference']}" in entry
    for name in (
        "held_out_vs_images",
        "held_out_vs_seconds",
        "training_reward",
        "reference_drift",
        "per_task",
    ):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC, name
    markdown = (out / "bench_learning.md").read_text()
    assert "best-of-8 (verifier)" in markdown and "| raft |" in markdown

    # A second call trains nothing again: every run is finished and the baselines are cached.
    logs = {path: path.stat().st_mtime for path in (out / "runs").rglob("metrics.jsonl")}
    second = run_bench(out)
    assert {path: path.stat().st_mtime for path in logs} == logs
    assert "done in" not in second.stdout
    assert (
        json.loads((out / "bench_learning.json").read_text())["algorithms"].keys()
        == report["algorithms"].keys()
    )


def test_a_suite_with_an_unknown_key_or_an_uneven_budget_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    for change, message in (
        ({"images": 100}, "images=100 is not a whole number of steps"),
        ({"recipe_images": {"nft": 100}}, "images=100 is not a whole number of steps of recipe 'nft'"),
        ({"recipe_images": {"not_a_recipe": 128}}, "recipe_images names ['not_a_recipe']"),
    ):
        bad.write_text(yaml.safe_dump({**SMOKE, **change}))
        with pytest.raises(SystemExit, match=re.escape(message)):
            suite = Suite.load(bad)
            for name in suite.recipes:  # as bench_learning.py checks every recipe before any run
                resolve(suite, name)
    # the command line says so and stops before anything runs
    bad.write_text(yaml.safe_dump({**SMOKE, "steps": 3}))
    command = [
        sys.executable,
        str(SCRIPTS / "bench_learning.py"),
        "--suite",
        str(bad),
        "--out",
        str(tmp_path / "o"),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode != 0 and "unknown keys ['steps']" in result.stderr
    assert not (tmp_path / "o").exists()
