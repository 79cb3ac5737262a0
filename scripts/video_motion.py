"""Does a video model move its objects, and the way the prompt says? Measured on the moving-shapes world.

For each held-out item of the motion-bearing tasks (``motion``, ``color_motion``, ``speed``; a prompt and a
seed, as the evaluation draws them) the model draws a clip (CFG-free Euler) and the renderer draws the
prompt's ground truth. In both, the verifier's detector finds the named object in every frame and a
least-squares fit of its centroids gives its velocity ``v`` (pixels per frame, ``fit_velocity``). Per
source:

- ``speed``: the median of ``|v|`` (renders move at 1 or 2.25 px/frame);
- ``moving``: the share with ``|v| >= MIN_SPEED`` (0.4 px/frame, the verifier's threshold);
- ``direction_cos``: the mean of ``cos(v, d)`` with ``d`` the named direction, over the moving clips
  (1: the named way; 0: unrelated to the word);
- ``motion_holds``: the share the verifier's motion check passes; ``tracked``: the share with a fit.

And the renoise probe, which separates "cannot draw motion" from "does not start it": renders are put
back on the straight path, ``x_t = (1 - t) x0 + t eps``, and the model denoises them from ``t`` (Euler, the
full run's step size); ``kept_speed`` is the median speed after over the median speed of the renders.
Where it stays near 1 up to high ``t``, the model can carry motion it is given, and what is missing is
the decision, at the highest noise levels, to move.

And the mean probe, which asks whether that decision can be made: at ``t = 1`` the input is pure noise,
so the best prediction ``x0_hat(eps, 1)`` is the mean of the prompt's clips, ``E[x0 | prompt]``. For a
moving object kept inside the frame that mean drifts the named way frame by frame (a quick object that
moves left must start on the right). Per prompt, ``x0_hat`` averaged over noises and the renders averaged
over layouts; each frame's brightness centroid along the named direction, a least-squares slope over
frames; ``drift_ratio`` is the model's slope over the renders' (1: the mean is right; 0: frame-blind).

    python scripts/video_motion.py --models shapes-video shapes-video-v2 --clips-per-task 32 --out docs/video_motion.json
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
from decision_time import denoise, write_results

from flowrl.evaluation import evaluation_items
from flowrl.generate import as_policy
from flowrl.models import load_shapes_model
from flowrl.policy import TUNED, Policy
from flowrl.worlds import WORLDS
from rewards.shapes_verifier import detect_objects
from rewards.video_shapes_verifier import (
    MIN_SPEED,
    REFERENCE_FRAME_SIZE,
    class_track,
    expected_frames,
    fit_velocity,
    motion_holds,
)
from rewards.world_spec import DIRECTION_VECTORS

MOTION_TASKS = ("motion", "color_motion", "speed")
LEVELS = (0.5, 0.7, 0.8, 0.9, 1.0)


def clip_motion(clip: np.ndarray, record: dict) -> dict[str, float]:
    """The named (first) object's fitted velocity in a ``[T, H, W, 3]`` clip, against the prompt's direction."""
    entry = record["include"][0]
    scale = min(clip.shape[1], clip.shape[2]) / REFERENCE_FRAME_SIZE
    track = class_track([detect_objects(frame) for frame in clip], entry["class"])
    velocity = fit_velocity(track, expected_frames(entry, len(clip)))
    if velocity is None:
        return {"tracked": 0.0, "speed": float("nan"), "cos": float("nan"), "holds": 0.0}
    speed = math.hypot(*velocity) / scale
    unit = DIRECTION_VECTORS[entry["motion"]]
    cos = (velocity[0] * unit[0] + velocity[1] * unit[1]) / (speed * scale) if speed > 0 else float("nan")
    return {
        "tracked": 1.0,
        "speed": speed,
        "cos": cos,
        "holds": float(motion_holds(velocity, entry["motion"], scale)),
    }


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    """``tracked``, ``speed`` (median), ``moving``, ``direction_cos`` (over moving clips), ``motion_holds``."""
    speeds = np.array([row["speed"] for row in rows])
    tracked = ~np.isnan(speeds)
    moving = tracked & (np.nan_to_num(speeds) >= MIN_SPEED)
    cosines = np.array([row["cos"] for row in rows])[moving]
    return {
        "clips": len(rows),
        "tracked": float(tracked.mean()),
        "speed": float(np.median(speeds[tracked])) if tracked.any() else float("nan"),
        "moving": float(moving.mean()),
        "direction_cos": float(cosines.mean()) if len(cosines) else float("nan"),
        "motion_holds": float(np.mean([row["holds"] for row in rows])),
    }


def as_clips(media: torch.Tensor) -> np.ndarray:
    """``[B, T, 3, H, W]`` in [0, 1] to ``[B, T, H, W, 3]`` numpy."""
    return media.permute(0, 1, 3, 4, 2).float().cpu().numpy()


def named_drift(clips: torch.Tensor, direction: str) -> float:
    """The least-squares slope over frames (pixels per frame) of the brightness centroid along ``direction``
    of the frame-wise mean of ``clips`` ``[N, T, 3, H, W]`` in model space (black is -1)."""
    ink = (clips.mean(0) + 1).clamp(min=0).sum(1)  # [T, H, W]
    height, width = ink.shape[-2:]
    rows, columns = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    unit_x, unit_y = DIRECTION_VECTORS[direction]
    along = (unit_x * columns + unit_y * rows).float()
    centroids = (ink * along).sum((1, 2)) / ink.sum((1, 2)).clamp(min=1e-6)
    frames = torch.arange(len(centroids), dtype=torch.float32)
    frames = frames - frames.mean()
    return float((frames * (centroids - centroids.mean())).sum() / frames.pow(2).sum())


def mean_drift(policy: Policy, records: list[dict], samples: int) -> dict[str, float]:
    """The mean probe of the module docstring over the distinct prompts of ``records``."""
    world = WORLDS["video_shapes"]
    velocity = policy.velocity_of(TUNED)
    shape = tuple(policy.flow_model.sample_shape)
    unique = {record["prompt"]: record for record in records}
    model_drifts, render_drifts = [], []
    for index, (prompt, record) in enumerate(sorted(unique.items())):
        eps = torch.randn((samples, *shape), generator=torch.Generator().manual_seed(index))
        with torch.no_grad():
            predicted = eps - velocity(eps, torch.ones(()), policy.encode([prompt] * samples))
        renders = np.stack(
            [world.render(record, np.random.default_rng([11, index, k]), shape) for k in range(samples)]
        )
        rendered = policy.flow_model.encode_media(torch.from_numpy(renders).permute(0, 1, 4, 2, 3))
        model_drifts.append(named_drift(predicted, record["include"][0]["motion"]))
        render_drifts.append(named_drift(rendered, record["include"][0]["motion"]))
    model_drifts, render_drifts = np.array(model_drifts), np.array(render_drifts)
    return {
        "prompts": len(unique),
        "model_drift": float(model_drifts.mean()),
        "render_drift": float(render_drifts.mean()),
        "drift_ratio": float(model_drifts.mean() / render_drifts.mean()),
    }


def motion_of(
    model_name: str, clips_per_task: int, num_steps: int, levels: tuple[float, ...], mean_samples: int = 16
) -> dict:
    """Generated and rendered motion, and the renoise probe (module docstring), for one model."""
    world = WORLDS["video_shapes"]
    policy = as_policy(load_shapes_model(model_name))
    items = evaluation_items(world.prompts("test"), clips_per_task, 0, MOTION_TASKS)
    records = [record for record, _ in items]
    prompts = [record["prompt"] for record in records]
    noise = policy.initial_noise([seed for _, seed in items], policy.device)
    generated = as_clips(policy.decode(denoise(policy, noise, 1.0, num_steps, prompts)))
    shape = tuple(noise.shape[1:])
    renders = np.stack(
        [world.render(record, np.random.default_rng([7, seed]), shape) for record, seed in items]
    )
    result = {
        "mean_probe": mean_drift(policy, records, mean_samples),
        "generated": summarise([clip_motion(clip, record) for clip, record in zip(generated, records)]),
        "rendered": summarise([clip_motion(clip, record) for clip, record in zip(renders, records)]),
        "renoised": {},
    }
    x0 = policy.flow_model.encode_media(torch.from_numpy(renders).permute(0, 1, 4, 2, 3))
    generator = torch.Generator().manual_seed(12345)
    for level in levels:
        eps = torch.randn(x0.shape, generator=generator)
        again = as_clips(
            policy.decode(denoise(policy, (1 - level) * x0 + level * eps, level, num_steps, prompts))
        )
        summary = summarise([clip_motion(clip, record) for clip, record in zip(again, records)])
        summary["kept_speed"] = summary["speed"] / result["rendered"]["speed"]
        result["renoised"][str(level)] = summary
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["shapes-video", "shapes-video-v2"])
    parser.add_argument("--clips-per-task", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="Euler steps of a full run")
    parser.add_argument("--levels", type=float, nargs="+", default=list(LEVELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--mean-samples", type=int, default=16, help="noises and renders per prompt (mean probe)"
    )
    parser.add_argument("--out", default="outputs/video_motion.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    results = {}
    columns = ("tracked", "speed", "moving", "direction_cos", "motion_holds")
    for name in args.models:
        results[name] = motion_of(
            name, args.clips_per_task, args.steps, tuple(args.levels), args.mean_samples
        )
        print(f"\n{name} ({results[name]['generated']['clips']} clips)")
        print("source".ljust(16) + "".join(f"{column:>14}" for column in columns) + f"{'kept_speed':>12}")
        rows = [("rendered", results[name]["rendered"]), ("generated", results[name]["generated"])]
        rows += [(f"renoised t={level}", row) for level, row in results[name]["renoised"].items()]
        for label, row in rows:
            kept = f"{row['kept_speed']:>12.2f}" if "kept_speed" in row else ""
            print(f"{label:<16}" + "".join(f"{row[column]:>14.3f}" for column in columns) + kept)
        probe = results[name]["mean_probe"]
        print(
            f"mean probe at t=1 ({probe['prompts']} prompts): drift along the named direction "
            f"{probe['model_drift']:.2f} px/frame, renders' mean {probe['render_drift']:.2f}, "
            f"ratio {probe['drift_ratio']:.2f}"
        )
    write_results(Path(args.out), args, started, results)


if __name__ == "__main__":
    main()
