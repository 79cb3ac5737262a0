"""Pretraining of the shapes-world base model by flow matching with condition dropout.

Each step renders a fresh batch of ground-truth scenes for random prompts of
the whole grammar (``grammar.sample_prompt``), replaces a share of the prompts
by the empty prompt (so classifier-free guidance works), draws a time
(``t ~ U(0, 1)``, or logit-normal ``t = sigmoid(m + s n)``, n ~ N(0, 1), which
with m > 0 spends more steps at high noise where layouts are decided) and
noise, and regresses the velocity::

    x_t = (1 - t) x0 + t eps,     loss = || v_theta(x_t, t, prompt) - (eps - x0) ||^2

``objective="meanflow"`` trains a MeanFlow model (the average velocity
``u(x, r, t)``, see :mod:`flowrl.models.shapes_dit`) with the MeanFlow loss::

    (t, r) = (max, min) of two time draws; a share with r = t, a share with r = 0
    v = eps - x0,   du/dt = d_x u . v + d_t u           (one JVP, samplers.induced_velocity)
    loss = || u_theta(x_t, r, t) - sg(v - (t - r) du/dt) ||^2 / sg(|| . ||^2 + c)^p     (per sample)

The adaptive weight (MeanFlow's, ``c = 1e-3``, ``p = meanflow_adaptive_p``)
turns the squared error into a robust loss: the regression target moves with
the model, and without it a few large-derivative samples make training diverge.

which at ``r = t`` is flow matching. ``init_from`` starts from a trained
flow model (its MeanFlow copy starts as ``u = v``), far cheaper than from scratch.

``world="video_shapes"`` trains a video model on rendered moving-shapes clips
``[B, T, 3, H, W]`` (:mod:`flowrl.video_shapes`) with the same flow-matching
loss; from an image model (``init_from``) it starts as
:meth:`ShapesDiT.as_video` of it, so shapes and colours are already known and
pretraining teaches motion. ``world="video_shapes_i2v"`` trains the same clips with each clip's frame 0
given to the model (``ShapesDiTConfig.image_condition``; a video model from ``init_from`` gets it added at
zero, :meth:`ShapesDiT.with_image_condition`): an image-to-video model that continues a first frame.

AdamW with linear warm-up then cosine decay; an exponential moving average of
the weights is what gets saved. ``mixed_precision`` runs the model's forward (and
backward) under bfloat16 autocast (:mod:`flowrl.precision`; float32 weights,
optimizer state and loss): 0.39 s against 0.65 s per step of 16 video clips on 2 cores with AVX-512 BF16.
Everything random derives from one seed, so a run is reproducible on the same machine, thread count and
precision.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from flowrl.checkpoint import (
    LATEST,
    checkpoint_config,
    read_checkpoint,
    resumable_checkpoint,
    write_checkpoint,
)
from flowrl.learning_rate import learning_rate_factor
from flowrl.models import load_shapes_model
from flowrl.models.shapes import images_to_model_space
from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig
from flowrl.precision import autocast, autocast_dtype, resolve_mixed_precision
from flowrl.pretrain_config import OBJECTIVES, TIME_SAMPLINGS, WORLDS, PretrainConfig
from flowrl.shapes import grammar as image_grammar
from flowrl.shapes.render import render_prompt
from flowrl.video_shapes import grammar as video_grammar
from flowrl.video_shapes.render import render_clip
from samplers import induced_velocity, interval_pairs

#: the folder of ``output_dir`` that holds the resumable checkpoints
CHECKPOINTS = "checkpoints"


def sample_times(batch_size: int, config: PretrainConfig) -> torch.Tensor:
    """Training times ``[B]`` in (0, 1): uniform, or ``sigmoid(m + s n)`` for ``time_sampling="logit_normal"``."""
    if config.time_sampling == "uniform":
        return torch.rand(batch_size)
    if config.time_sampling == "logit_normal":
        return torch.sigmoid(config.time_mean + config.time_std * torch.randn(batch_size))
    raise ValueError(f"unknown time_sampling {config.time_sampling!r}; allowed: {TIME_SAMPLINGS}")


def sample_intervals(batch_size: int, config: PretrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """MeanFlow's ``(t, r)``: the larger and smaller of two time draws, then ``r = t`` for a share
    ``meanflow_equal_share`` of the rows and ``r = 0`` for a share ``meanflow_zero_share``."""
    first, second = sample_times(batch_size, config), sample_times(batch_size, config)
    return interval_pairs(
        first, second, torch.rand(batch_size), config.meanflow_equal_share, config.meanflow_zero_share
    )


def meanflow_loss(
    model: ShapesDiT,
    x0: torch.Tensor,
    noise: torch.Tensor,
    t: torch.Tensor,
    r: torch.Tensor,
    cond: tuple,
    adaptive_p: float = 0.0,
    adaptive_c: float = 1e-3,
) -> torch.Tensor:
    """The MeanFlow loss of the module docstring, ``du/dt`` along ``(v, 1)``; ``adaptive_p = 0``: plain MSE."""
    column = t.view(-1, *[1] * (x0.ndim - 1))
    x_t = (1 - column) * x0 + column * noise
    v = noise - x0
    induced, u = induced_velocity(lambda x, r_, t_, c: model(x, t_, *c, r=r_), x_t, r, t, cond, v, "jvp")
    induced, u = induced.float(), u.float()  # float32 under bf16 autocast too
    target = (v - (induced - u)).detach()  # induced - u = (t - r) du/dt
    per_sample = (u - target).pow(2).flatten(1).mean(dim=1)
    if adaptive_p:
        per_sample = per_sample / (per_sample.detach() + adaptive_c) ** adaptive_p
    return per_sample.mean()


def learning_rate_at(step: int, config: PretrainConfig) -> float:
    """Linear warm-up to ``learning_rate``, then cosine decay to ``min_learning_rate_ratio`` of it."""
    factor = learning_rate_factor(
        step, config.warmup_steps, config.steps, "cosine", config.min_learning_rate_ratio
    )
    return config.learning_rate * factor


def training_batch(
    rng: np.random.Generator,
    batch_size: int,
    condition_dropout: float,
    world: str = "shapes",
    num_frames: int = 8,
) -> tuple[torch.Tensor, list[str]]:
    """Rendered samples in model space — images ``[B, 3, 32, 32]``, or clips ``[B, T, 3, 32, 32]`` for
    ``world="video_shapes"`` — and their prompts (dropped ones are ``""``)."""
    if world == "shapes":
        records = [image_grammar.sample_prompt(rng) for _ in range(batch_size)]
        media = np.stack([render_prompt(record, rng) for record in records])
    else:
        records = [video_grammar.sample_prompt(rng) for _ in range(batch_size)]
        media = np.stack([render_clip(record, rng, num_frames) for record in records])
    prompts = [record["prompt"] if rng.random() >= condition_dropout else "" for record in records]
    return images_to_model_space(torch.from_numpy(media).movedim(-1, -3)), prompts


def initial_model(config: PretrainConfig) -> ShapesDiT:
    """The model pretraining starts from: ``init_from`` (made a MeanFlow or video model when the objective
    or world needs one), else a fresh one of the config's size."""
    meanflow, video = config.objective == "meanflow", config.world != "shapes"
    continues = config.world == "video_shapes_i2v"
    if meanflow and continues:
        raise ValueError(
            "objective='meanflow' is not allowed with world='video_shapes_i2v' (flow matching only)"
        )
    if config.init_from:
        model = load_shapes_model(config.init_from)
        if model.is_video and not video:
            raise ValueError(f"init_from={config.init_from!r} is a video model; world='shapes' trains images")
        if model.is_video and (model.config.num_frames, model.config.frame_patch) != (
            config.num_frames,
            config.frame_patch,
        ):
            raise ValueError(
                f"init_from={config.init_from!r} has num_frames={model.config.num_frames}, "
                f"frame_patch={model.config.frame_patch}; this run asks for num_frames={config.num_frames}, "
                f"frame_patch={config.frame_patch}"
            )
        if video and not model.is_video:
            model = model.as_video(
                video_grammar.vocabulary(),
                config.num_frames,
                config.frame_patch,
                config.video_attention,
                frame_condition=config.frame_condition,
            )
        if config.frame_condition and not model.config.frame_condition:
            model = model.with_frame_condition()
        if model.config.image_condition and not continues:
            raise ValueError(
                f"init_from={config.init_from!r} is an image-to-video model; world={config.world!r} trains "
                "clips without a first frame (use world='video_shapes_i2v')"
            )
        if continues and not model.config.image_condition:
            model = model.with_image_condition()
        if meanflow and not model.config.mean_flow:
            model = model.as_mean_flow()
        window = config.text_neighbour_window
        if window and model.config.text_neighbour_window not in (0, window):
            raise ValueError(
                f"init_from={config.init_from!r} has text_neighbour_window={model.config.text_neighbour_window}; "
                f"this run asks for {window}"
            )
        if window and not model.config.text_neighbour_window:
            model = model.with_neighbour_window(window)
        return model
    return ShapesDiT(
        ShapesDiTConfig(
            vocabulary=(video_grammar if video else image_grammar).vocabulary(),
            patch_size=config.patch_size,
            hidden_size=config.hidden_size,
            depth=config.depth,
            num_heads=config.num_heads,
            text_hidden_size=config.text_hidden_size,
            text_layers=config.text_layers,
            text_neighbour_window=config.text_neighbour_window,
            prediction=config.prediction,
            mean_flow=meanflow,
            num_frames=config.num_frames if video else 1,
            frame_patch=config.frame_patch if video else 1,
            video_attention=config.video_attention,
            frame_condition=config.frame_condition and video,
            image_condition=continues,
        )
    )


def save_model_atomically(model: ShapesDiT, directory: Path) -> None:
    """Save ``model`` to ``directory`` through a temporary sibling and a rename (never half-written)."""
    temporary = directory.with_name(directory.name + ".tmp")
    if temporary.exists():
        shutil.rmtree(temporary)
    model.save_pretrained(temporary)
    if directory.exists():
        shutil.rmtree(directory)
    temporary.rename(directory)


def checkpoint_payload(
    model: ShapesDiT,
    ema: ShapesDiT,
    optimizer: torch.optim.Optimizer,
    rng: np.random.Generator,
    losses: list[float],
    seconds: float,
) -> dict[str, Any]:
    """Everything a resumed run needs to continue bit for bit, in types ``torch.load(weights_only=True)``
    reads (NumPy's generator state as JSON text)."""
    return {
        "model": model.state_dict(),
        "ema": ema.state_dict(),
        "optimizer": optimizer.state_dict(),
        "progress": {
            "losses": torch.tensor(losses, dtype=torch.float64),
            "seconds": seconds,
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": json.dumps(rng.bit_generator.state),
        },
    }


def resume_from(
    directory: Path,
    config: PretrainConfig,
    model: ShapesDiT,
    ema: ShapesDiT,
    optimizer: torch.optim.Optimizer,
    rng: np.random.Generator,
) -> tuple[int, list[float], float]:
    """Restore the newest verified checkpoint of ``directory`` into the run; ``(step, losses, seconds)``, or a
    fresh start ``(0, [], 0.0)`` when there is none. A checkpoint of different settings is refused."""
    found = resumable_checkpoint(LATEST, directory)
    if found is None:
        return 0, [], 0.0
    saved = checkpoint_config(found) or {}
    changed = sorted(key for key, value in asdict(config).items() if saved.get(key) != value)
    if changed:
        raise ValueError(
            f"--resume: {found} was written with other settings ({', '.join(changed)}); "
            "resume with the same flags, or pretrain into a new --out"
        )
    step, payload = read_checkpoint(found)
    model.load_state_dict(payload["model"])
    ema.load_state_dict(payload["ema"])
    optimizer.load_state_dict(payload["optimizer"])
    progress = payload["progress"]
    torch.set_rng_state(progress["torch_rng"])
    rng.bit_generator.state = json.loads(progress["numpy_rng"])
    return step, progress["losses"].tolist(), float(progress["seconds"])


def pretrain(config: PretrainConfig, output_dir: str | Path, resume: bool = False) -> ShapesDiT:
    """Train a :class:`ShapesDiT` from scratch; save the EMA weights and ``pretrain.json`` to ``output_dir``.

    ``resume``: continue from the newest checkpoint in ``<output_dir>/checkpoints`` (written every
    ``checkpoint_every`` steps), bit for bit as if never stopped; a fresh start when there is none."""
    if config.time_sampling not in TIME_SAMPLINGS:
        raise ValueError(f"unknown time_sampling {config.time_sampling!r}; allowed: {TIME_SAMPLINGS}")
    if config.objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {config.objective!r}; allowed: {OBJECTIVES}")
    if config.world not in WORLDS:
        raise ValueError(f"unknown world {config.world!r}; allowed: {WORLDS}")
    output_dir = Path(output_dir)
    precision, why = resolve_mixed_precision(
        config.mixed_precision, torch.device("cpu"), bf16_pays_on_cpu=True
    )
    if why:
        print(why)
    # the resolved value is what the checkpoints record and a resume is checked against
    config = replace(config, mixed_precision=precision)
    dtype = autocast_dtype(precision)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    meanflow = config.objective == "meanflow"
    model = initial_model(config).train()
    ema = ShapesDiT(model.config)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, betas=(0.9, 0.99), weight_decay=config.weight_decay
    )
    checkpoints = output_dir / CHECKPOINTS
    first_step, losses, seconds_before = (
        resume_from(checkpoints, config, model, ema, optimizer, rng) if resume else (0, [], 0.0)
    )
    start = time.time()
    progress = tqdm(
        range(first_step, config.steps),
        desc=f"pretrain {config.world}",
        dynamic_ncols=True,
        initial=first_step,
        total=config.steps,
    )
    for step in progress:
        x0, prompts = training_batch(
            rng, config.batch_size, config.condition_dropout, config.world, config.num_frames
        )
        noise = torch.randn_like(x0)
        with autocast(x0.device, dtype):
            if meanflow:
                t, r = sample_intervals(config.batch_size, config)
                loss = meanflow_loss(
                    model, x0, noise, t, r, model.encode_prompts(prompts), config.meanflow_adaptive_p
                )
            else:
                t = sample_times(config.batch_size, config)
                t_ = t.view(-1, *[1] * (x0.ndim - 1))
                x_t = (1 - t_) * x0 + t_ * noise
                image = x0[:, 0] if model.config.image_condition else None  # the frame an I2V model continues
                v = model(x_t, t, *model.encode_prompts(prompts), image=image)
                loss = (v.float() - (noise - x0)).pow(2).mean()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        decay = min(config.ema_decay, (1 + step) / (10 + step))
        with torch.no_grad():
            for ema_param, param in zip(ema.parameters(), model.parameters()):
                ema_param.lerp_(param, 1 - decay)
        losses.append(loss.item())
        if step % 10 == 0:
            progress.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if config.save_every and (step + 1) % config.save_every == 0 and step + 1 < config.steps:
            save_model_atomically(ema, output_dir / f"step_{step + 1:06d}")
        if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0 and step + 1 < config.steps:
            seconds = seconds_before + time.time() - start
            payload = checkpoint_payload(model, ema, optimizer, rng, losses, seconds)
            write_checkpoint(checkpoints, step + 1, payload, config=asdict(config))
    ema.save_pretrained(output_dir)
    record = {
        "config": asdict(config),
        "seconds": round(seconds_before + time.time() - start, 1),
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss_every_100_steps": [
            round(float(np.mean(losses[i : i + 100])), 5) for i in range(0, len(losses), 100)
        ],
    }
    (output_dir / "pretrain.json").write_text(json.dumps(record, indent=2) + "\n")
    return ema
