"""The demo app's functions, without a browser: correct scores, run discovery, every error as a message,
and only the runs it offers loaded (each exploit found against it refused)."""

import time
from pathlib import Path

import gradio as gr
import pytest
import torch
from app_runs import make_run

import app.app as demo_app
from app.app import compare, on_generate, run_overview
from app.cli import build_parser
from app.prompts import parse_prompt
from app.runs import Catalog, find_runs, load_model, source_choices
from app.scores import check_run_code, scores_cards, verdict
from flowrl.generate import generate
from flowrl.shapes.render import SceneObject, draw_scene
from rewards import ShapesVerifier

PROMPT = "a red circle and a blue square"
NOT_OFFERED = "That is not one of the offered runs or checkpoints"


pytestmark = pytest.mark.usefixtures("one_thread")


def mean_brightness(images, prompts, metadata):
    """A harmless reward a trusted run may name by dotted path (``test_app:mean_brightness``)."""
    return images.mean(dim=(1, 2, 3))


@pytest.fixture
def run(tmp_path, tiny_model, tiny_model_dir):
    return make_run(tmp_path / "runs" / "run_a", tiny_model_dir, tiny_model)


@pytest.fixture
def catalog(tmp_path, tiny_model_dir):
    """What the app offers: the runs under ``tmp_path/runs``, with the tiny model as the base."""
    return Catalog(tmp_path / "runs", str(tiny_model_dir))


def _generate(catalog, tuned, prompt=PROMPT, trust_run_code=False, **settings):
    """``on_generate`` on the catalog's base with small defaults; returns the UI's outputs or raises the
    ``gr.Error`` it raised."""
    values = {
        "seed": 3,
        "num_images": 2,
        "num_steps": 4,
        "sampler": "euler",
        "base_cfg": 1.0,
        "tuned_cfg": 1.0,
        "base": catalog.base,
    }
    values.update(settings)
    return on_generate(prompt, *values.values(), tuned, catalog=catalog, trust_run_code=trust_run_code)


def _error(catalog, tuned, prompt=PROMPT, **settings) -> str:
    with pytest.raises(gr.Error) as caught:
        _generate(catalog, str(tuned), prompt, **settings)
    return caught.value.message


def test_scores_are_the_verifiers_on_the_same_images(run, tiny_model_dir, catalog):
    result = compare(PROMPT, 3, 2, 4, "heun", 1.0, 2.0, str(tiny_model_dir), str(run), catalog=catalog)
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


def test_generate_button_returns_galleries_score_cards_and_summary(run, catalog):
    base_gallery, base_cards, tuned_gallery, tuned_cards, summary = _generate(catalog, str(run), num_images=3)
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
    boxes = {getattr(b, "label", None): b for b in demo.blocks.values()}
    selector, base = boxes["Tuned run or checkpoint"], boxes["Base model"]
    assert selector.value == str(new) and selector.choices == [(c, c) for c in source_choices(root)]
    assert not selector.allow_custom_value and not base.allow_custom_value  # no typed-in paths


def test_the_base_defaults_to_the_runs_own_base(tmp_path, tiny_model, tiny_model_dir):
    """A run trained from shipped shapes-base is compared with shapes-base, not the newer default; a run whose
    base the app does not offer, or a source it does not offer, gives no base (the default stays)."""
    root = tmp_path / "runs"
    from_v1 = make_run(root / "from_v1", tiny_model_dir, tiny_model)
    config = from_v1 / "config.yaml"
    config.write_text(config.read_text().replace(str(tiny_model_dir), "shapes-base"))
    elsewhere = make_run(root / "elsewhere", tmp_path / "not_offered", tiny_model)
    catalog = Catalog(root)
    assert catalog.run_base(str(from_v1)) == "shapes-base"
    assert catalog.run_base(str(from_v1 / "checkpoints" / "step_000005")) == "shapes-base"
    assert catalog.run_base(str(elsewhere)) is None
    assert catalog.run_base(str(tmp_path / "not_listed")) is None and catalog.run_base(None) is None
    boxes = {
        getattr(b, "label", None): b for b in demo_app.build_app(str(from_v1), runs_root=root).blocks.values()
    }
    assert boxes["Base model"].value == "shapes-base"
    named = demo_app.build_app(str(from_v1), str(tiny_model_dir), root).blocks.values()
    assert {getattr(b, "label", None): b for b in named}["Base model"].value == str(tiny_model_dir)


def test_run_overview_draws_the_curves_of_the_run(run, tiny_model_dir, catalog):
    curves, text = run_overview(str(run / "checkpoints" / "step_000005"), catalog=catalog)
    assert curves is not None and curves.endswith(".png")
    assert "5 steps" in text and "held-out GenEval 0.400" in text
    named = Catalog(catalog.root, catalog.base, str(tiny_model_dir))  # a model given on the command line
    assert run_overview(str(tiny_model_dir), catalog=named) == (
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
        ("a red circle " * 160_000, "The prompt is 2,080,000 characters"),  # not echoed
    ],
)
def test_bad_prompts_are_messages(run, catalog, prompt, message):
    error = _error(catalog, run, prompt)
    assert message in error and len(error) < 400


def test_free_text_is_read_case_and_space_insensitively():
    assert parse_prompt("  A Photo of   THREE circles ")["include"] == [{"class": "circle", "count": 3}]


def test_missing_and_broken_models_are_messages(run, catalog, tmp_path):
    # Paths given on the command line are loaded as given, and say what is wrong with them.
    missing = Catalog(catalog.root, catalog.base, str(tmp_path / "missing"))
    assert "no model, run or checkpoint at" in _error(missing, tmp_path / "missing")
    no_base = Catalog(catalog.root, str(tmp_path / "no_base"))
    assert "no model, run or checkpoint at" in _error(no_base, run)
    assert "Choose a tuned run or checkpoint" in _error(catalog, "")
    (tmp_path / "not_a_model").mkdir()
    not_a_model = Catalog(catalog.root, catalog.base, str(tmp_path / "not_a_model"))
    assert "is neither a shipped model" in _error(not_a_model, tmp_path / "not_a_model")
    checkpoint = run / "checkpoints" / "step_000005"
    with (checkpoint / "policy.pt").open("r+b") as handle:
        handle.truncate(100)
    assert "(truncated)" in _error(catalog, checkpoint)


def test_bad_settings_are_messages(run, catalog):
    assert "number of images must be between 1 and 8" in _error(catalog, run, num_images=0)
    assert "number of steps must be between 1 and 100" in _error(catalog, run, num_steps=1000)
    assert "Unknown sampler 'rk4'" in _error(catalog, run, sampler="rk4")
    assert "seed must be at least 0, got -1" in _error(catalog, run, seed=-1)
    for scale in (float("nan"), float("inf"), 1e308, -1.0):
        assert "CFG scales must be finite numbers from 0 to 20" in _error(catalog, run, tuned_cfg=scale)


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: out of memory"
        ),
    ],
)
def test_out_of_memory_is_a_message(run, catalog, monkeypatch, error):
    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(demo_app, "generate", out_of_memory)
    assert _error(catalog, run).startswith("Out of memory while generating: use fewer images")


def test_an_unexpected_error_is_one_line_without_traceback(run, catalog, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("velocity")

    monkeypatch.setattr(demo_app, "generate", broken)
    assert _error(catalog, run) == "Generation failed (KeyError: 'velocity')."


def test_demo_command_binds_to_loopback_and_trusts_no_run_code_unless_told():
    args = build_parser().parse_args(["runs/main"])
    assert (args.tuned, args.host, args.share, args.base) == (
        "runs/main",
        "127.0.0.1",
        False,
        None,  # the run's own base, else shapes-base-v2 (test_the_base_defaults_to_the_runs_own_base)
    )
    assert args.trust_run_code is False
    assert build_parser().parse_args(["--host", "0.0.0.0"]).host == "0.0.0.0"
    assert build_parser().parse_args(["--trust-run-code"]).trust_run_code is True


def test_flowrl_demo_hands_its_arguments_to_the_app(capsys):
    from flowrl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0 and "usage: flowrl demo" in capsys.readouterr().out


# --- The app loads only what it offers, and a run's config names no code unless trusted.


def test_a_run_outside_the_root_is_refused_without_naming_it(
    run, catalog, tmp_path, tiny_model, tiny_model_dir
):
    outside = make_run(tmp_path / "elsewhere" / "run", tiny_model_dir, tiny_model)
    for source in (
        outside,
        outside / "model",
        catalog.root / ".." / "elsewhere" / "run",
        "/etc",
        "shapes-base",
    ):
        message = _error(catalog, source)
        assert message.startswith(NOT_OFFERED) and str(source) not in message and "elsewhere" not in message
        assert run_overview(str(source), catalog=catalog) == (None, message)
    for value in (5, ["x"], {"path": str(outside)}):  # the API takes any JSON value
        with pytest.raises(gr.Error, match="Choose a tuned run"):
            _generate(catalog, value)
        assert run_overview(value, catalog=catalog) == (None, "No tuned run selected.")
    base = _error(catalog, run, base=str(outside / "model"))
    assert base.startswith("That is not one of the offered base models") and "elsewhere" not in base
    assert compare(PROMPT, 0, 1, 1, "euler", 1.0, 1.0, catalog.base, str(run), catalog=catalog).seeds == [0]


def test_symlinks_that_lead_out_of_the_root_are_not_followed(
    run, catalog, tmp_path, tiny_model, tiny_model_dir
):
    outside = make_run(tmp_path / "elsewhere" / "run", tiny_model_dir, tiny_model)
    (catalog.root / "linked").symlink_to(outside, target_is_directory=True)
    borrowed = make_run(catalog.root / "borrowed", tiny_model_dir, tiny_model)
    for name in ("model", "config.yaml"):  # a run whose files live elsewhere
        target = borrowed / name
        target.rename(tmp_path / "elsewhere" / name)
        target.symlink_to(tmp_path / "elsewhere" / name)
    inner = make_run(catalog.root / "inner", tiny_model_dir, tiny_model)
    (catalog.root / "alias").symlink_to(inner, target_is_directory=True)  # stays inside: offered
    assert set(find_runs(catalog.root)) == {run, inner, catalog.root / "alias"}
    for source in (catalog.root / "linked", borrowed, borrowed / "checkpoints" / "step_000005"):
        assert _error(catalog, source).startswith(NOT_OFFERED)


def _shell_rewards(form: str, marker: Path) -> dict:
    """A ``rewards`` section that makes the reward registry run ``touch marker`` in a shell, in one of
    three forms: as an entry's reward, as an entry's name, or nested in a registered reward's settings."""
    shell = {"args": f"touch {marker}", "shell": True}
    return {
        "reward": {"pwn": {"reward": "subprocess:Popen", "settings": shell}},
        "entry name": {"subprocess:Popen": {"settings": shell}},
        "nested": {
            "frames": {
                "reward": "frame_average",
                "settings": {"reward": "subprocess:Popen", "settings": shell},
            }
        },
    }[form]


def _appears(path: Path, seconds: float = 10.0) -> bool:
    """Whether ``path`` exists within ``seconds`` (a shell started in the background creates it)."""
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


@pytest.mark.parametrize("form", ["reward", "entry name", "nested"])
def test_a_run_naming_code_is_refused_unless_trusted(catalog, tmp_path, tiny_model, tiny_model_dir, form):
    marker = tmp_path / "pwned"
    rewards = _shell_rewards(form, marker)
    evil = make_run(catalog.root / "evil", tiny_model_dir, tiny_model, rewards=rewards)
    message = _error(catalog, evil)
    assert f"'subprocess:Popen' in reward entry {next(iter(rewards))!r}" in message
    assert "Start the app with --trust-run-code to allow it" in message
    assert run_overview(str(evil), catalog=catalog)[0] is not None  # shown, its reward not built
    assert not marker.exists()
    # The exploit as it was found: trusted, the run's config.yaml runs its shell command.
    with pytest.raises(gr.Error):
        _generate(catalog, str(evil), trust_run_code=True)
    assert _appears(marker)


def test_a_rewards_section_must_be_a_mapping_of_entries():
    with pytest.raises(ValueError, match="has rewards \\['subprocess:Popen'\\]; expected a mapping"):
        check_run_code(["subprocess:Popen"])


def test_a_trusted_run_may_name_its_reward_by_dotted_path(catalog, tiny_model, tiny_model_dir):
    rewards = {"shapes_verifier": 1.0, "brightness": {"reward": "test_app:mean_brightness", "weight": 0.5}}
    run = make_run(catalog.root / "custom", tiny_model_dir, tiny_model, rewards=rewards)
    assert "'test_app:mean_brightness' in reward entry 'brightness'" in _error(catalog, run)
    result = compare(
        PROMPT, 0, 2, 2, "euler", 1.0, 1.0, catalog.base, str(run), catalog=catalog, trust_run_code=True
    )
    for row, image in zip(result.tuned.scores, result.tuned.images):
        assert row.scores["brightness"] == pytest.approx(float(image.mean()))
        assert row.total == pytest.approx(
            row.scores["shapes_verifier/partial"] + 0.5 * row.scores["brightness"]
        )


def test_the_verdict_says_what_each_check_counted():
    record = parse_prompt("a red circle")
    one = draw_scene([SceneObject("circle", "red", 8, 16, 9)])
    beside_blue = draw_scene(
        [SceneObject("circle", "red", 8, 16, 9), SceneObject("circle", "blue", 24, 16, 9)]
    )
    none = draw_scene([SceneObject("square", "red", 8, 16, 9)])
    lines = [
        verdict(torch.from_numpy(image).permute(2, 0, 1), record)[0] for image in (one, beside_blue, none)
    ]
    # One red circle beside a blue one: the count check counts circles of any colour (2 for 1 asked).
    assert lines == [
        ["1 red circle: 1 circle ✓, 1/1 red ✓"],
        ["1 red circle: 2 circles ✗, 1/2 red 0.50"],
        ["1 red circle: 0 circles ✗, 0/0 red ✗"],
    ]
