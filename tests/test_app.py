"""The demo app's functions, without a browser: correct scores, run discovery, and every error as a message."""

import time

import gradio as gr
import pytest
import torch
from app_runs import make_run

import app.app as demo_app
from app.app import compare, on_generate, run_overview
from app.cli import build_parser
from app.prompts import parse_prompt
from app.runs import find_runs, load_model, source_choices
from app.scores import scores_cards
from flowrl.generate import generate
from rewards import ShapesVerifier

PROMPT = "a red circle and a blue square"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def run(tmp_path, tiny_model, tiny_model_dir):
    return make_run(tmp_path / "runs" / "run_a", tiny_model_dir, tiny_model)


def _generate(tuned, base, prompt=PROMPT, **settings):
    """``on_generate`` with small defaults; returns the UI's outputs or raises the ``gr.Error`` it raised."""
    values = {
        "seed": 3,
        "num_images": 2,
        "num_steps": 4,
        "sampler": "euler",
        "base_cfg": 1.0,
        "tuned_cfg": 1.0,
    }
    values.update(settings)
    return on_generate(prompt, *values.values(), str(base), str(tuned))


def _error(tuned, base, prompt=PROMPT, **settings) -> str:
    with pytest.raises(gr.Error) as caught:
        _generate(tuned, base, prompt, **settings)
    return caught.value.message


def test_scores_are_the_verifiers_on_the_same_images(run, tiny_model_dir):
    result = compare(PROMPT, 3, 2, 4, "heun", 1.0, 2.0, str(tiny_model_dir), str(run))
    record = parse_prompt(PROMPT)
    assert result.seeds == [3, 4] and record["tag"] == "color_attr"
    for side, source, scale in ((result.base, tiny_model_dir, 1.0), (result.tuned, run, 2.0)):
        images = generate(load_model(str(source)), [PROMPT] * 2, [3, 4], 4, scale, solver="heun")
        torch.testing.assert_close(side.images, images, rtol=0, atol=1e-6)
        expected = ShapesVerifier()(side.images, [PROMPT] * 2, [record] * 2)
        for index, row in enumerate(side.scores):
            assert row.scores == {f"shapes_verifier/{k}": float(v[index]) for k, v in expected.items()}
            assert row.total == row.scores["shapes_verifier/partial"]
            assert len(row.verdict) == len(record["include"])
    cards = scores_cards("tuned", result.tuned.scores)
    assert f'data-value="{result.tuned.scores[0].total!r}"' in cards and 'data-side="tuned"' in cards


def test_generate_button_returns_galleries_score_cards_and_summary(run, tiny_model_dir):
    base_gallery, base_cards, tuned_gallery, tuned_cards, summary = _generate(
        run, tiny_model_dir, num_images=3
    )
    assert len(base_gallery) == len(tuned_gallery) == 3
    assert base_gallery[0][0].size == (demo_app.DISPLAY_SIZE, demo_app.DISPLAY_SIZE)
    assert [caption for _, caption in base_gallery] == ["seed 3", "seed 4", "seed 5"]
    assert 'data-side="base"' in base_cards and 'data-side="tuned"' in tuned_cards
    assert PROMPT in summary


def test_a_checkpoint_and_a_run_without_model_load_the_checkpoint_weights(run, tiny_model_dir):
    checkpoint = run / "checkpoints" / "step_000005"
    expected = load_model(str(run / "model")).state_dict()
    for source in (checkpoint, run):
        if source == run:
            (run / "model" / "config.json").unlink()  # a run still training: its newest checkpoint
        loaded = load_model(str(source), str(tiny_model_dir)).state_dict()
        assert all(torch.equal(loaded[name], expected[name]) for name in expected)


def test_runs_are_listed_newest_first_and_the_app_opens_on_the_newest(tmp_path, tiny_model, tiny_model_dir):
    root = tmp_path / "runs"
    now = time.time()
    old = make_run(root / "old", tiny_model_dir, tiny_model, mtime=now - 100)
    new = make_run(root / "new", tiny_model_dir, tiny_model, mtime=now)
    (root / "empty").mkdir()
    assert find_runs(root) == [new, old]
    assert source_choices(root) == [
        str(new),
        str(new / "checkpoints/step_000005"),
        str(old),
        str(old / "checkpoints/step_000005"),
    ]
    demo = demo_app.build_app(base=str(tiny_model_dir), runs_root=root)
    selector = next(b for b in demo.blocks.values() if getattr(b, "label", None) == "Tuned run or checkpoint")
    assert selector.value == str(new)


def test_run_overview_draws_the_curves_of_the_run(run, tiny_model_dir):
    curves, text = run_overview(str(run / "checkpoints" / "step_000005"))
    assert curves is not None and curves.endswith(".png")
    assert "5 steps" in text and "held-out GenEval 0.400" in text
    assert run_overview(str(tiny_model_dir)) == (
        None,
        f"`{tiny_model_dir}` belongs to no run directory, so there are no curves to show.",
    )


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "Enter a prompt"),
        ("   ", "Enter a prompt"),
        ("a red elephant", "does not know the word(s) 'elephant'"),
        ("circle a red", "is not a sentence of the shapes grammar"),
    ],
)
def test_bad_prompts_are_messages(run, tiny_model_dir, prompt, message):
    assert message in _error(run, tiny_model_dir, prompt)


def test_free_text_is_read_case_and_space_insensitively():
    assert parse_prompt("  A Photo of   THREE circles ")["include"] == [{"class": "circle", "count": 3}]


def test_missing_and_broken_models_are_messages(run, tiny_model_dir, tmp_path):
    assert "no model, run or checkpoint at" in _error(tmp_path / "missing", tiny_model_dir)
    assert "no model, run or checkpoint at" in _error(run, tmp_path / "no_base")
    assert "Choose a tuned run or checkpoint" in _error("", tiny_model_dir)
    (tmp_path / "not_a_model").mkdir()
    assert "is neither a shipped model" in _error(tmp_path / "not_a_model", tiny_model_dir)
    checkpoint = run / "checkpoints" / "step_000005"
    with (checkpoint / "policy.pt").open("r+b") as handle:
        handle.truncate(100)
    assert "(truncated)" in _error(checkpoint, tiny_model_dir)


def test_bad_settings_are_messages(run, tiny_model_dir):
    assert "number of images must be between 1 and 8" in _error(run, tiny_model_dir, num_images=0)
    assert "number of steps must be between 1 and 100" in _error(run, tiny_model_dir, num_steps=1000)
    assert "Unknown sampler 'rk4'" in _error(run, tiny_model_dir, sampler="rk4")


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: out of memory"
        ),
    ],
)
def test_out_of_memory_is_a_message(run, tiny_model_dir, monkeypatch, error):
    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(demo_app, "generate", out_of_memory)
    assert _error(run, tiny_model_dir).startswith("Out of memory while generating: use fewer images")


def test_an_unexpected_error_is_one_line_without_traceback(run, tiny_model_dir, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("velocity")

    monkeypatch.setattr(demo_app, "generate", broken)
    assert _error(run, tiny_model_dir) == "Generation failed (KeyError: 'velocity')."


def test_demo_command_binds_to_loopback_unless_told():
    args = build_parser().parse_args(["runs/main"])
    assert (args.tuned, args.host, args.share, args.base) == ("runs/main", "127.0.0.1", False, "shapes-base")
    assert build_parser().parse_args(["--host", "0.0.0.0"]).host == "0.0.0.0"


def test_flowrl_demo_hands_its_arguments_to_the_app(capsys):
    from flowrl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0 and "usage: flowrl demo" in capsys.readouterr().out
