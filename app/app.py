"""The flowrl demo: one prompt and seeds through a base and a tuned model, side by side, with their rewards.

:func:`compare` and :func:`run_overview` are the plain functions behind the UI (usable and testable without a
browser); :func:`on_generate` is the event handler that turns their errors into messages; :func:`build_app`
lays out the ``gr.Blocks``; :func:`launch` serves it, on the loopback interface unless told otherwise.
Generation runs in Gradio's queue (one at a time, off the UI thread) with a progress bar.

Anyone who reaches the server can call its API with any values, so the handlers take their inputs raw (no
Gradio preprocessing) and check each one themselves: models only from the :class:`~app.runs.Catalog` (the runs
under the runs root and the models named on the command line), and a run's reward only from registered
rewards unless the app was started with ``--trust-run-code``.
"""

from __future__ import annotations

import functools
import hashlib
import html
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch
from PIL import Image
from starlette.middleware import Middleware

from app.limits import MAX_IMAGES, MAX_REQUEST_SIZE, MAX_STEPS, check_settings
from app.origins import AllowedOrigins
from app.prompts import held_out_prompts, parse_prompt
from app.runs import Catalog, left_out_runs, load_model, reward_spec, run_config
from app.scores import CARDS_CSS, ImageScores, build_reward, score_images, scores_cards
from flowrl.checkpoint import CheckpointError
from flowrl.generate import generate
from flowrl.models import DEFAULT_BASE
from flowrl.run_log import plot_curves, read_metrics
from flowrl.shapes.grammar import TASKS, PromptRecord
from rewards import MissingWeightsError, RewardError
from samplers import ODE_SOLVERS

logger = logging.getLogger(__name__)

#: Side of the displayed images: the model's 32 px, enlarged without smoothing.
DISPLAY_SIZE = 160
#: Where run curves are drawn (files Gradio may serve: they are under the temporary directory).
CURVES_DIR = Path(tempfile.gettempdir()) / "flowrl-app"

Progress = Callable[[float, str], None]


def _no_progress(fraction: float, description: str) -> None:
    """A progress callback that shows nothing."""


@dataclass
class Side:
    """One side of a comparison: its guidance scale, its images ``[B, 3, H, W]`` and their scores."""

    guidance_scale: float
    images: torch.Tensor
    scores: list[ImageScores]


@dataclass
class Comparison:
    """The same prompt and seeds through the base and the tuned model."""

    record: PromptRecord
    seeds: list[int]
    num_steps: int
    sampler: str
    base: Side
    tuned: Side


def device() -> str:
    """The accelerator when there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def compare(
    prompt: str,
    seed: int,
    num_images: int,
    num_steps: int,
    sampler: str,
    base_cfg: float,
    tuned_cfg: float,
    base: str,
    tuned: str,
    progress: Progress = _no_progress,
    *,
    catalog: Catalog,
    trust_run_code: bool = False,
) -> Comparison:
    """Generate ``num_images`` images (seeds ``seed, seed + 1, ...``) of ``prompt`` with both models and score them.

    ``base`` and ``tuned`` must be offered by ``catalog``. Both sides are scored with the reward the tuned
    model's run trained with, which may name code to import (a dotted path) only when ``trust_run_code``. Bad
    input raises ``ValueError`` (or ``FileNotFoundError`` for a missing model) with a message for the user.
    """
    num_images, num_steps, seed = int(num_images), int(num_steps), int(seed)
    base_cfg, tuned_cfg = float(base_cfg), float(tuned_cfg)
    check_settings(seed, num_images, num_steps, sampler, (base_cfg, tuned_cfg))
    if not _filled(base):
        raise ValueError("Choose a base model.")
    if not _filled(tuned):
        raise ValueError("Choose a tuned run or checkpoint (train one first: bash scripts/main.sh).")
    base, tuned = catalog.checked_base(base), catalog.checked_tuned(tuned)
    reward = build_reward(reward_spec(catalog.run_dir(tuned)), trust_run_code)
    progress(0.0, "loading models")
    target = device()
    models = {"base": load_model(base, device=target), "tuned": load_model(tuned, base, target)}
    record = parse_prompt(prompt, tuple(models.values()))
    seeds = list(range(seed, seed + num_images))
    sides = {}
    for index, (name, scale) in enumerate((("base", base_cfg), ("tuned", tuned_cfg))):
        progress(0.1 + 0.45 * index, f"sampling the {name} model")
        images = generate(
            models[name], [record["prompt"]] * num_images, seeds, num_steps, float(scale), solver=sampler
        ).cpu()
        progress(0.4 + 0.45 * index, f"scoring the {name} model's images")
        sides[name] = Side(float(scale), images, score_images(reward, images, record, seeds))
    progress(1.0, "done")
    return Comparison(record, seeds, num_steps, sampler, sides["base"], sides["tuned"])


def _filled(value: object) -> bool:
    """Whether a submitted value is a non-blank string."""
    return isinstance(value, str) and bool(value.strip())


#: Errors of bad input or missing files: their message is the whole story.
EXPECTED_ERRORS = (ValueError, FileNotFoundError, CheckpointError, MissingWeightsError, RewardError)


def error_message(error: BaseException) -> str:
    """What the app shows for an error: its message for expected ones, a short line (no traceback) otherwise."""
    if isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    ):
        return "Out of memory while generating: use fewer images or fewer steps, then try again."
    if isinstance(error, EXPECTED_ERRORS):
        return str(error)
    return f"Generation failed ({type(error).__name__}: {error})."


def gallery(side: Side) -> list[tuple[Image.Image, str]]:
    """Gallery items of a side: each image enlarged to :data:`DISPLAY_SIZE` px, captioned with its seed."""
    pixels = (side.images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [
        (
            Image.fromarray(image).resize((DISPLAY_SIZE, DISPLAY_SIZE), Image.Resampling.NEAREST),
            f"seed {row.seed}",
        )
        for image, row in zip(pixels, side.scores)
    ]


def summary(result: Comparison) -> str:
    """One line of Markdown: what was generated and the mean reward of each side."""
    mean = {
        name: sum(row.total for row in side.scores) / len(side.scores)
        for name, side in (("base", result.base), ("tuned", result.tuned))
    }
    return (
        f"**{result.record['prompt']}** ({result.record['tag']}), seeds {result.seeds[0]}–{result.seeds[-1]}, "
        f"{result.num_steps} {result.sampler} steps, CFG {result.base.guidance_scale:g} / "
        f"{result.tuned.guidance_scale:g}: mean reward **{mean['base']:.3f}** (base) vs "
        f"**{mean['tuned']:.3f}** (tuned)"
    )


def on_generate(
    prompt: str,
    seed: float,
    num_images: float,
    num_steps: float,
    sampler: str,
    base_cfg: float,
    tuned_cfg: float,
    base: str,
    tuned: str,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's way to ask for a progress bar)
    *,
    catalog: Catalog,
    trust_run_code: bool = False,
) -> tuple[list, str, list, str, str]:
    """The Generate button: ``(base gallery, base scores, tuned gallery, tuned scores, summary)``.

    Every error becomes a ``gr.Error``, which the app shows as a message; ``catalog`` and ``trust_run_code`` are
    bound by :func:`build_app`.
    """
    try:
        result = compare(
            prompt,
            seed,
            num_images,
            num_steps,
            sampler,
            base_cfg,
            tuned_cfg,
            base,
            tuned,
            lambda fraction, description: progress(fraction, desc=description),
            catalog=catalog,
            trust_run_code=trust_run_code,
        )
    except Exception as error:
        if not isinstance(error, EXPECTED_ERRORS):
            logger.exception("generation failed")  # the traceback goes to the server's log, not the page
        raise gr.Error(error_message(error), print_exception=False) from error
    return (
        gallery(result.base),
        scores_cards("base", result.base.scores),
        gallery(result.tuned),
        scores_cards("tuned", result.tuned.scores),
        summary(result),
    )


def run_overview(source: str, *, catalog: Catalog) -> tuple[str | None, str]:
    """``(curves PNG path or None, Markdown about the run)`` of the run an offered tuned source belongs to;
    a source ``catalog`` does not offer gets the refusal as its text. ``catalog`` is bound by :func:`build_app`."""
    if not _filled(source):
        return None, "No tuned run selected."
    try:
        source = catalog.checked_tuned(source)
    except ValueError as error:
        return None, str(error)
    run_dir = catalog.run_dir(source)
    if run_dir is None:
        return None, f"`{source}` belongs to no run directory, so there are no curves to show."
    rows = read_metrics(run_dir / "metrics.jsonl")
    config = run_config(run_dir)
    algorithm = config.get("algorithm", {}).get("name", "?")
    text = f"Run `{run_dir}`: {algorithm}, reward {reward_spec(run_dir)}"
    if not rows:
        return None, text + "; no metrics yet."
    train = [row for row in rows if "reward/mean" in row]
    evals = [row for row in rows if "eval/geneval/overall" in row]
    if train:
        text += f"; {train[-1]['step']} steps, last training reward {train[-1]['reward/mean']:.3f}"
    if evals:
        text += f"; held-out GenEval {evals[-1]['eval/geneval/overall']:.3f} at step {evals[-1]['step']}"
    key = hashlib.sha1(f"{run_dir.resolve()}:{len(rows)}".encode()).hexdigest()[:16]
    path = CURVES_DIR / f"curves-{key}.png"  # drawn once per run and number of metrics rows
    if not path.is_file():
        plot_curves(rows, path, title=str(run_dir))
    return str(path), text + "."


def _prompts_of(task: str) -> gr.Dropdown:
    return gr.Dropdown(choices=held_out_prompts()[task], value=None)


def _pick(prompt: str | None, current: str) -> str:
    return prompt or current


def _side_outputs(side: str) -> tuple[gr.Gallery, gr.HTML]:
    """The gallery and the score cards of the ``base`` or ``tuned`` side, in one column."""
    with gr.Column():
        images = gr.Gallery(
            label=side.capitalize(),
            columns=4,
            height="fit-content",
            preview=False,
            format="png",
            interactive=False,
            elem_id=f"{side}-gallery",
        )
        return images, gr.HTML(elem_id=f"{side}-scores", css_template=CARDS_CSS)


def build_app(
    tuned: str | None = None,
    base: str | None = None,
    runs_root: str | Path = "runs",
    trust_run_code: bool = False,
) -> gr.Blocks:
    """The demo as ``gr.Blocks``; ``tuned`` defaults to the newest run under ``runs_root``, ``base`` to the
    tuned run's own base model (then :data:`DEFAULT_BASE`); choosing another run selects its base.

    It offers, and loads, only the runs under ``runs_root`` and the ``base`` and ``tuned`` models given here
    (see :class:`~app.runs.Catalog`); a run's reward may name code to import only when ``trust_run_code``.
    """
    catalog = Catalog(Path(runs_root), base or DEFAULT_BASE, tuned)
    tuned_choices = catalog.tuned_choices()
    left_out = left_out_runs(runs_root)
    tuned = tuned or (tuned_choices[0] if tuned_choices else None)
    base = base or catalog.run_base(tuned) or DEFAULT_BASE
    generate_event = functools.partial(on_generate, catalog=catalog, trust_run_code=trust_run_code)
    overview_event = functools.partial(run_overview, catalog=catalog)
    first_task = TASKS[0]
    with gr.Blocks(title="flowrl: base vs tuned", analytics_enabled=False) as demo:
        gr.Markdown(
            "## flowrl: base vs tuned\n"
            "The same prompt and seeds through the base model and a tuned run, side by side. "
            "Both sides are scored with the reward the run trained with; the verdict is the shapes "
            "verifier's, per object the prompt asks for."
        )
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                base_box = gr.Dropdown(catalog.base_choices(), value=base, label="Base model")
                tuned_box = gr.Dropdown(
                    tuned_choices,
                    value=tuned,
                    label="Tuned run or checkpoint",
                    info=f"runs found under {runs_root}/, newest first"
                    if tuned_choices
                    else f"no run under {runs_root}/",
                )
                if left_out:
                    gr.Markdown(
                        "Not offered: "
                        + "; ".join(
                            f"`{html.escape(name)}` ({html.escape(reason)})" for name, reason in left_out
                        ),
                        elem_id="left-out",
                    )
                task = gr.Dropdown(list(TASKS), value=first_task, label="Held-out prompts: task")
                held_out = gr.Dropdown(held_out_prompts()[first_task], value=None, label="Held-out prompt")
                prompt = gr.Textbox(
                    value=held_out_prompts()[first_task][0],
                    label="Prompt",
                    info="free text in the shapes grammar, or pick a held-out prompt above",
                    elem_id="prompt",
                )
                button = gr.Button("Generate", variant="primary", elem_id="generate")
                with gr.Row():
                    seed = gr.Number(value=0, precision=0, label="Seed", minimum=0)
                    num_images = gr.Slider(1, MAX_IMAGES, value=4, step=1, label="Images")
                num_steps = gr.Slider(1, MAX_STEPS, value=20, step=1, label="Steps")
                sampler = gr.Radio(list(ODE_SOLVERS), value="euler", label="Sampler")
                with gr.Row():
                    base_cfg = gr.Slider(0, 10, value=1.0, step=0.5, label="CFG base", info="1 = off")
                    tuned_cfg = gr.Slider(0, 10, value=1.0, step=0.5, label="CFG tuned", info="1 = off")
            with gr.Column(scale=3):
                status = gr.Markdown("Pick a prompt and press Generate.", elem_id="status")
                with gr.Row(equal_height=False):
                    base_gallery, base_scores = _side_outputs("base")
                    tuned_gallery, tuned_scores = _side_outputs("tuned")
                run_text = gr.Markdown(elem_id="run-info")
                curves = gr.Image(label="Run curves (metrics.jsonl)", type="filepath", interactive=False)
        task.change(_prompts_of, task, held_out)
        held_out.change(_pick, [held_out, prompt], prompt)
        # Raw inputs (preprocess=False): the handlers check every value themselves, with messages
        # that do not repeat what was sent.
        button.click(
            generate_event,
            [prompt, seed, num_images, num_steps, sampler, base_cfg, tuned_cfg, base_box, tuned_box],
            [base_gallery, base_scores, tuned_gallery, tuned_scores, status],
            api_name="generate",
            preprocess=False,
        )
        tuned_box.change(
            overview_event, tuned_box, [curves, run_text], api_name="run_overview", preprocess=False
        )
        tuned_box.change(
            lambda source: catalog.run_base(source) or gr.skip(),
            tuned_box,
            base_box,
            api_visibility="private",
            preprocess=False,
        )
        demo.load(overview_event, tuned_box, [curves, run_text], api_visibility="private", preprocess=False)
    return demo


def launch(
    tuned: str | None = None,
    base: str | None = None,
    runs_root: str | Path = "runs",
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    block: bool = True,
    trust_run_code: bool = False,
    allowed_hosts: Sequence[str] = (),
) -> gr.Blocks:
    """Build and serve the app (one generation at a time); ``block=False`` returns while it serves.

    ``trust_run_code`` lets a run's ``config.yaml`` name rewards by dotted path (code the app imports).
    Requests must come from the app's own page (:class:`app.origins.AllowedOrigins`): by IP address,
    ``localhost``, ``host`` or one of ``allowed_hosts``.
    """
    demo = build_app(tuned, base, runs_root, trust_run_code).queue(default_concurrency_limit=1)
    demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        prevent_thread_lock=not block,
        ssr_mode=False,
        max_file_size=MAX_REQUEST_SIZE,
        app_kwargs={"middleware": [Middleware(AllowedOrigins, hosts=[host, *allowed_hosts])]},
    )
    return demo
