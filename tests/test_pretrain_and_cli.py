import json
import shutil

import numpy as np
import pytest
import torch

import flowrl.precision
import flowrl.pretrain
import flowrl.pretrain_config
from flowrl.cli import main
from flowrl.evaluation import colour_drift, evaluation_items, geneval_scores
from flowrl.models import SHIPPED_MODELS, load_shapes_model
from flowrl.pretrain import PretrainConfig, learning_rate_at, pretrain
from flowrl.pretrain import training_batch as real_training_batch
from flowrl.shapes.grammar import TASKS, shipped_prompts
from flowrl.shapes.render import render_prompt

TINY = dict(steps=3, batch_size=4, warmup_steps=2, hidden_size=32, depth=1, num_heads=2)


def test_pretraining_is_deterministic_given_a_seed(tmp_path):
    first = pretrain(PretrainConfig(**TINY, seed=5), tmp_path / "a")
    second = pretrain(PretrainConfig(**TINY, seed=5), tmp_path / "b")
    other = pretrain(PretrainConfig(**TINY, seed=6), tmp_path / "c")
    for (name, p), q in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(p, q), name
    assert any(
        not torch.equal(p, r) for p, r in zip(first.state_dict().values(), other.state_dict().values())
    )
    record = json.loads((tmp_path / "a" / "pretrain.json").read_text())
    assert record["config"]["seed"] == 5 and len(record["loss_every_100_steps"]) == 1
    assert (tmp_path / "a" / "model.safetensors").is_file()


def test_cli_pretrain_passes_settings(tmp_path):
    out = tmp_path / "model"
    args = ["pretrain-shapes", "--out", str(out), "--steps", "2", "--batch-size", "2", "--warmup-steps", "1"]
    args += [
        "--hidden-size",
        "32",
        "--depth",
        "1",
        "--num-heads",
        "2",
        "--learning-rate",
        "0.002",
        "--seed",
        "3",
    ]
    assert main(args) == 0
    record = json.loads((out / "pretrain.json").read_text())
    assert record["config"]["learning_rate"] == 0.002 and record["config"]["steps"] == 2
    assert record["config"]["seed"] == 3 and record["config"]["hidden_size"] == 32
    assert load_shapes_model(str(out)).config.hidden_size == 32
    chunked = tmp_path / "chunked"
    args = [a if a != str(out) else str(chunked) for a in args] + ["--checkpoint-every", "1", "--resume"]
    assert main(args) == 0 and (chunked / "checkpoints" / "step_000001").is_dir()
    assert main(args) == 0  # the same line again: a finished run's last checkpoint resumes, step 2 reruns


def test_cli_pretrain_reads_true_or_false_for_a_yes_no_setting(tmp_path, capsys):
    """``--frame-condition false`` is False (argparse's ``bool`` would make any text True); other text is a
    one-line usage error naming it."""
    from flowrl.cli import boolean

    assert [boolean(text) for text in ("true", "False", "1", "no")] == [True, False, True, False]
    with pytest.raises(SystemExit):
        main(["pretrain-shapes", "--out", str(tmp_path / "x"), "--frame-condition", "maybe"])
    assert "'maybe' is not allowed; expected true or false" in capsys.readouterr().err


def test_pretraining_adds_and_trains_a_neighbour_window_on_a_model_without_one(tiny_model_dir, tmp_path):
    """``text_neighbour_window`` with ``init_from``: the loaded model gets a zero convolution, which the steps
    move; a fresh model is built with it; an init model with another window is refused by name."""
    config = PretrainConfig(**{**TINY, "steps": 2}, init_from=str(tiny_model_dir), text_neighbour_window=3)
    mixing = pretrain(config, tmp_path / "mixed").text_encoder.neighbour_mixing
    assert mixing.kernel_size == (3,) and mixing.weight.abs().sum() > 0
    assert load_shapes_model(str(tmp_path / "mixed")).config.text_neighbour_window == 3
    fresh = pretrain(PretrainConfig(**TINY, text_neighbour_window=5), tmp_path / "fresh")
    assert fresh.text_encoder.neighbour_mixing.kernel_size == (5,)
    other = PretrainConfig(**TINY, init_from=str(tmp_path / "mixed"), text_neighbour_window=5)
    with pytest.raises(ValueError, match="has text_neighbour_window=3; this run asks for 5"):
        pretrain(other, tmp_path / "other")


def test_a_resumed_pretraining_ends_bit_for_bit_where_an_unbroken_one_does(tmp_path, monkeypatch):
    settings = dict(TINY, steps=6, checkpoint_every=2, seed=4)
    unbroken = pretrain(PretrainConfig(**settings), tmp_path / "unbroken")
    broken = tmp_path / "broken"
    pretrain(PretrainConfig(**settings), broken)  # leaves the checkpoints of steps 2 and 4
    shutil.rmtree(broken / "checkpoints" / "step_000004")  # as if killed between steps 2 and 4
    batches = []
    monkeypatch.setattr(
        flowrl.pretrain, "training_batch", lambda *a, **k: batches.append(1) or real_training_batch(*a, **k)
    )
    resumed = pretrain(PretrainConfig(**settings), broken, resume=True)
    assert len(batches) == 4  # steps 3 to 6 only
    for (name, p), q in zip(unbroken.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    record = json.loads((broken / "pretrain.json").read_text())
    unbroken_record = json.loads((tmp_path / "unbroken" / "pretrain.json").read_text())
    assert record["loss_every_100_steps"] == unbroken_record["loss_every_100_steps"]
    with pytest.raises(ValueError, match="other settings \\(learning_rate\\)"):
        pretrain(PretrainConfig(**dict(settings, learning_rate=0.5)), broken, resume=True)
    batches.clear()
    pretrain(PretrainConfig(**settings), tmp_path / "nothing_yet", resume=True)
    assert len(batches) == 6  # no checkpoint: a fresh start


def test_pretraining_in_bf16_records_the_resolved_precision_and_follows_float32(tmp_path, monkeypatch):
    """bf16 autocast trains the same model up to rounding; ``auto`` is resolved (and recorded) before the
    run, so a resume under another precision is refused by name."""
    settings = dict(TINY, seed=2, checkpoint_every=2)
    full = pretrain(PretrainConfig(**settings, mixed_precision="no"), tmp_path / "float32")
    half = pretrain(PretrainConfig(**settings, mixed_precision="bf16"), tmp_path / "bf16")
    records = [json.loads((tmp_path / name / "pretrain.json").read_text()) for name in ("float32", "bf16")]
    assert [record["config"]["mixed_precision"] for record in records] == ["no", "bf16"]
    losses = [record["loss_every_100_steps"][0] for record in records]
    assert losses[0] == pytest.approx(losses[1], rel=0.05) and losses[0] != losses[1]
    moved = [(f - h).abs().max().item() for f, h in zip(full.parameters(), half.parameters())]
    assert 0 < max(moved) < 0.05
    monkeypatch.setattr(flowrl.precision, "cpu_has_bfloat16_matmul", lambda: False)
    pretrain(PretrainConfig(**settings, mixed_precision="auto"), tmp_path / "auto")
    assert json.loads((tmp_path / "auto" / "pretrain.json").read_text())["config"]["mixed_precision"] == "no"
    with pytest.raises(ValueError, match="other settings \\(mixed_precision\\)"):
        pretrain(PretrainConfig(**settings, mixed_precision="auto"), tmp_path / "bf16", resume=True)
    assert flowrl.pretrain_config.MIXED_PRECISIONS == flowrl.precision.MIXED_PRECISIONS


def test_learning_rate_schedule():
    config = PretrainConfig(steps=100, warmup_steps=10, learning_rate=1.0, min_learning_rate_ratio=0.1)
    assert learning_rate_at(0, config) == pytest.approx(0.1)
    assert learning_rate_at(10, config) == pytest.approx(1.0)
    assert learning_rate_at(100, config) == pytest.approx(0.1)


def test_evaluation_items_balance_tasks():
    items = evaluation_items(shipped_prompts("test"), images_per_task=5, seed=10)
    assert len(items) == 5 * len(TASKS)
    assert [seed for _, seed in items] == list(range(10, 10 + 5 * len(TASKS)))
    assert [record["tag"] for record, _ in items] == [task for task in TASKS for _ in range(5)]


def test_colour_drift_is_zero_on_the_data_and_grows_off_it():
    items = evaluation_items(shipped_prompts("test"), 4)
    truth = torch.from_numpy(
        np.stack([render_prompt(record, np.random.default_rng(seed)) for record, seed in items])
    ).permute(0, 3, 1, 2)
    assert colour_drift(truth, items) == 0.0
    other_layouts = torch.from_numpy(
        np.stack([render_prompt(record, np.random.default_rng(seed + 999)) for record, seed in items])
    ).permute(0, 3, 1, 2)
    noisy = (truth + 0.1 * torch.randn_like(truth)).clamp(0, 1)
    grey = torch.full_like(truth, 0.5)
    drifts = [colour_drift(images, items) for images in (other_layouts, noisy, grey)]
    assert drifts[0] < 0.05 < drifts[1] < drifts[2] <= 1.0  # same scenes elsewhere ~ 0; noise, then grey, far


def test_geneval_overall_is_the_mean_of_tasks():
    tags = [
        "single_object",
        "single_object",
        "counting",
        "counting",
        "colors",
        "position",
        "two_object",
        "color_attr",
    ]
    strict = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    partial = torch.tensor([1.0, 0.5, 1.0, 1.0, 0.5, 1.0, 0.5, 0.5])
    scores = geneval_scores(tags, strict, partial)
    assert scores["geneval/single_object"] == 0.5 and scores["geneval/counting"] == 1.0
    assert scores["geneval/overall"] == pytest.approx((0.5 + 1 + 0 + 1 + 0 + 0) / 6)
    assert scores["partial/overall"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="needs every task"):
        geneval_scores(tags[:2], strict[:2], partial[:2])
    with pytest.raises(ValueError, match="images_per_task"):
        evaluation_items(shipped_prompts("test"), images_per_task=0)


def test_cli_eval_writes_json_with_geneval_keys_and_grid(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "model")
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            "--model",
            str(tmp_path / "model"),
            "--images-per-task",
            "2",
            "--steps",
            "2",
            "--cfg",
            "1",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    for name in ("eval_cfg_free", "eval_cfg_3"):
        scores = json.loads((out / f"{name}.json").read_text())
        assert {"geneval/overall", *(f"geneval/{task}" for task in TASKS)} <= set(scores)
        assert 0.0 <= scores["geneval/overall"] <= 1.0 and scores["num_images"] == 2 * len(TASKS)
        assert (out / f"{name}.png").stat().st_size > 0
    assert set(json.loads((out / "summary.json").read_text())) == {"eval_cfg_free", "eval_cfg_3"}


def test_cli_eval_split_train_scores_the_training_prompts(tiny_model, tmp_path, monkeypatch):
    import flowrl.evaluation

    tiny_model.save_pretrained(tmp_path / "model")
    evaluated = []
    real_evaluate = flowrl.evaluation.evaluate

    def spy(sampler, records, *arguments):
        evaluated.append([record["prompt"] for record in records])
        return real_evaluate(sampler, records, *arguments)

    monkeypatch.setattr(flowrl.evaluation, "evaluate", spy)
    out = tmp_path / "eval"
    arguments = ["eval", "--model", str(tmp_path / "model"), "--images-per-task", "1", "--steps", "1"]
    assert main([*arguments, "--split", "train", "--out", str(out)]) == 0
    assert evaluated[-1] == [record["prompt"] for record in shipped_prompts("train")]
    assert json.loads((out / "eval_cfg_free.json").read_text())["split"] == "train"
    assert main([*arguments, "--out", str(out)]) == 0
    assert evaluated[-1] == [record["prompt"] for record in shipped_prompts("test")]
    with pytest.raises(SystemExit):
        main([*arguments, "--split", "validation"])


def test_cli_sample_writes_a_grid(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "model")
    out = tmp_path / "grid.png"
    assert (
        main(
            [
                "sample",
                "--model",
                str(tmp_path / "model"),
                "--prompt",
                "a red circle",
                "--prompt",
                "two squares",
                "--seeds",
                "0",
                "1",
                "--steps",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert out.stat().st_size > 0


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    assert main(["sample", "--model", str(tmp_path / "nowhere"), "--prompt", "a circle"]) == 2
    assert "neither a shipped model" in capsys.readouterr().err
    assert main(["sample", "--prompt", "a purple dog", "--steps", "1", "--out", str(tmp_path / "x.png")]) == 2
    assert "'dog'" in capsys.readouterr().err


def test_shipped_base_model_loads_and_generates():
    model = load_shapes_model("shapes-base")
    assert (SHIPPED_MODELS["shapes-base"] / "MODEL_CARD.md").is_file()
    assert 1e6 <= sum(p.numel() for p in model.parameters()) <= 1e7
    from flowrl.generate import generate

    images = generate(model, ["a red circle"], [0], num_steps=2)
    assert images.shape == (1, 3, 32, 32)


def test_reward_settings_parse_yaml_scalars_and_dtypes():
    from flowrl.cli import _parse_settings

    assert _parse_settings(["scale=3", "name=ViT-B-32", "flag=true", "dtype=bfloat16"]) == {
        "scale": 3,
        "name": "ViT-B-32",
        "flag": True,
        "dtype": torch.bfloat16,
    }
    with pytest.raises(ValueError, match="dtype='half' is not allowed; allowed"):
        _parse_settings(["dtype=half"])
    with pytest.raises(ValueError, match="not key=value"):
        _parse_settings(["scale"])
