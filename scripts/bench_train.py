"""Benchmark a training step: where its time goes, and peak memory.

Runs a few steps of a training config (default: the main job) and splits each
step into rollout, reward (time spent waiting for the background scorer),
loss + backward, optimizer (clip, step, old-policy and EMA updates) and the
rest. Forward hooks on the networks (trained, old, reference) and a timer
around every backward give the time inside the model itself; the overhead is
everything else: ``1 - (forward + backward) / step``.

Then one more step runs with its FLOPs counted per phase (rollout, loss
forward, loss backward, reward) and the matrix-multiply shapes each phase
runs recorded; the roofline table sets each phase's achieved GFLOP/s (counted
FLOPs over its median seconds) against a bare GEMM at the phase's own shapes
and at 2048-cubed, measured in the same run (:mod:`roofline`).

    python scripts/bench_train.py --steps 4 --out outputs/bench_train.json [override ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

import torch
from roofline import PhaseCounter, peak_gemm_rate, print_roofline, roofline_rows

from flowrl.config import load_config
from flowrl.policy import OLD, REFERENCE
from flowrl.trainer import Trainer
from rewards import AsyncScorer


class NetworkTimer:
    """Wall time spent inside the forward of the given modules and inside ``accelerator.backward``."""

    def __init__(self, trainer: Trainer) -> None:
        self.forward = self.backward = 0.0
        self._started: list[float] = []
        copies = trainer.policy.copies
        modules = [copies.unwrapped, copies.compute[OLD], copies.compute[REFERENCE]]
        for module in modules:
            module.register_forward_pre_hook(lambda *_: self._started.append(time.perf_counter()))
            module.register_forward_hook(lambda *_: self._stop())
        backward = trainer.accelerator.backward

        def timed_backward(loss, **kwargs):
            start = time.perf_counter()
            backward(loss, **kwargs)
            self.backward += time.perf_counter() - start

        trainer.accelerator.backward = timed_backward

    def _stop(self) -> None:
        self.forward += time.perf_counter() - self._started.pop()

    def reset(self) -> None:
        self.forward = self.backward = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/shapes_nft.yaml")
    parser.add_argument("--steps", type=int, default=4, help="measured steps (after one warm-up step)")
    parser.add_argument("--out", default="outputs/bench_train.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    run_dir = Path("outputs/bench_train_run")
    shutil.rmtree(run_dir, ignore_errors=True)  # scratch: the timed steps' run folder
    config = load_config(
        args.config, [*args.overrides, f"logging.output_dir={run_dir}", "logging.sample_every=0"]
    )
    trainer = Trainer(config)
    timer = NetworkTimer(trainer)
    rows = []
    with AsyncScorer(trainer.reward) as scorer:
        for index in range(args.steps + 1):
            trainer.step += 1
            timer.reset()
            start = time.perf_counter()
            row = trainer.train_step(scorer)
            step_seconds = time.perf_counter() - start
            if index == 0:
                continue  # warm-up
            network = timer.forward + timer.backward
            rows.append(
                {
                    "step_seconds": step_seconds,
                    "rollout": row["time/rollout"],
                    "reward_wait": row["time/reward"],
                    "loss_backward": row["time/loss_backward"],
                    "optimizer": row["time/optimizer"],
                    "other": step_seconds
                    - row["time/rollout"]
                    - row["time/reward"]
                    - row["time/loss_backward"]
                    - row["time/optimizer"],
                    "network_forward": timer.forward,
                    "network_backward": timer.backward,
                    "overhead_share": 1 - network / step_seconds,
                }
            )
        counter = PhaseCounter()
        trainer.rollout_and_score = counter.count("rollout", trainer.rollout_and_score)
        trainer.algorithm.loss = counter.count("loss forward", trainer.algorithm.loss)
        trainer.accelerator.backward = counter.count("loss backward", trainer.accelerator.backward)
        scorer.reward = counter.count("reward", trainer.reward)  # runs on the scorer's thread
        trainer.step += 1
        trainer.train_step(scorer)
    median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    phase_seconds = {
        "rollout": median["rollout"],
        "loss forward": median["loss_backward"] - median["network_backward"],
        "loss backward": median["network_backward"],
    }
    counted = {phase: counter.flops[phase] for phase in phase_seconds}
    counted["training"] = counted["loss forward"] + counted["loss backward"]
    phase_seconds["training"] = median["loss_backward"]
    shapes = dict(counter.shapes)
    shapes["training"] = counter.shapes.get("loss forward", Counter()) + counter.shapes.get(
        "loss backward", Counter()
    )
    roofline = roofline_rows(counted, phase_seconds, shapes, peak_gemm_rate())
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_cuda_mib = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None

    images = config.images_per_step
    print(
        f"{args.config}: {images} images/step, {config.sampler.num_steps} rollout steps, "
        f"{config.algorithm.train_timesteps} training timesteps, {torch.get_num_threads()} threads"
    )
    print(f"{'part':<18}{'seconds':>10}{'share':>9}")
    for key in ("rollout", "reward_wait", "loss_backward", "optimizer", "other"):
        print(f"{key:<18}{median[key]:>10.3f}{median[key] / median['step_seconds']:>9.1%}")
    print(f"{'step':<18}{median['step_seconds']:>10.3f}{1:>9.0%}")
    print(
        f"inside the networks: forward {median['network_forward']:.3f}s + backward "
        f"{median['network_backward']:.3f}s; overhead outside them {median['overhead_share']:.1%} of the step"
    )
    print(
        f"peak memory: {peak_rss_mib:.0f} MiB RSS"
        + (f", {peak_cuda_mib:.0f} MiB CUDA" if peak_cuda_mib else "")
    )
    print(f"\nroofline (reward: {counter.flops['reward'] / 1e9:.2f} GFLOP counted in torch per step)")
    print_roofline(roofline)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.overrides,
                "images_per_step": images,
                "threads": torch.get_num_threads(),
                "median": median,
                "steps": rows,
                "peak_rss_mib": peak_rss_mib,
                "peak_cuda_mib": peak_cuda_mib,
                "reward_gflop": counter.flops["reward"] / 1e9,
                "roofline": roofline,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
