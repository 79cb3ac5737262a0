"""Training-step time of variants of one config, interleaved in one process: float32 against bfloat16.

Each variant is a ``name=override,override`` (empty for the config as it is); every variant gets its own
:class:`~flowrl.trainer.Trainer` on the same config, one warm-up step, then rounds that run one step of
every variant in turn (fp32, bf16, fp32, bf16, ...), so a slower or faster spell of the machine falls on
all of them alike. The table gives each variant's median step and its parts (rollout, loss + backward,
optimizer), the per-round ratio to the first variant (median, min, max), and the bare GEMM rate of
float32 and bfloat16 at 2048-cubed and at the shapes model's width beside it::

    python scripts/bench_precision.py --rounds 6 --out outputs/bench_precision.json \\
        --variant fp32=training.mixed_precision=no --variant bf16=training.mixed_precision=bf16 -- [override ...]

Overrides after ``--`` apply to every variant (default config: the main job). Run it on a quiet machine:
never time anything beside another CPU-bound job.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import torch
from roofline import gemm_rate

from flowrl.config import load_config
from flowrl.trainer import Trainer
from rewards import AsyncScorer

PARTS = ("rollout", "loss_backward", "optimizer")
#: the GEMM shapes the rate table reports: (label, batch, m, k, n)
GEMM_SHAPES = (("2048 cubed", 1, 2048, 2048, 2048), ("4096 x 128 x 128 (shapes-base)", 1, 4096, 128, 128))


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, separator, overrides = text.partition("=")
    if not separator or not name:
        raise SystemExit(
            f"--variant {text!r} is not allowed; write NAME=override,override (or NAME= for none)"
        )
    return name, [override for override in overrides.split(",") if override]


def timed_step(trainer: Trainer, scorer: AsyncScorer) -> dict[str, float]:
    trainer.step += 1
    start = time.perf_counter()
    row = trainer.train_step(scorer)
    return {"step": time.perf_counter() - start, **{part: row[f"time/{part}"] for part in PARTS}}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/shapes_nft_main.yaml")
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds (after one warm-up step each)")
    parser.add_argument("--variant", action="append", type=parse_variant, required=True)
    parser.add_argument("--out", default="outputs/bench_precision.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    trainers, scratch = {}, Path("outputs/bench_precision_runs")
    shutil.rmtree(scratch, ignore_errors=True)
    for name, overrides in args.variant:
        run_dir = scratch / name
        config = load_config(
            args.config,
            [*args.overrides, *overrides, f"logging.output_dir={run_dir}", "logging.sample_every=0"],
        )
        trainers[name] = Trainer(config)
    steps: dict[str, list[dict[str, float]]] = {name: [] for name in trainers}
    scorers = {name: AsyncScorer(trainer.reward) for name, trainer in trainers.items()}
    try:
        for name, trainer in trainers.items():
            timed_step(trainer, scorers[name])  # warm-up
        for round_index in range(args.rounds):
            for name, trainer in trainers.items():
                steps[name].append(timed_step(trainer, scorers[name]))
            line = "  ".join(f"{name} {steps[name][-1]['step']:.2f}s" for name in trainers)
            print(f"round {round_index + 1}/{args.rounds}: {line}", flush=True)
    finally:
        for scorer in scorers.values():
            scorer.close()

    first = next(iter(trainers))
    summary = {}
    for name in trainers:
        ratios = [a["step"] / b["step"] for a, b in zip(steps[first], steps[name])]
        summary[name] = {
            **{key: statistics.median(step[key] for step in steps[name]) for key in ("step", *PARTS)},
            "speed_up_median": statistics.median(ratios),
            "speed_up_min": min(ratios),
            "speed_up_max": max(ratios),
        }
    gemm = {
        label: {
            str(dtype).removeprefix("torch."): gemm_rate(batch, m, k, n, dtype=dtype) / 1e9
            for dtype in (torch.float32, torch.bfloat16)
        }
        for label, batch, m, k, n in GEMM_SHAPES
    }

    print(
        f"\n{args.config} {' '.join(args.overrides)}, {torch.get_num_threads()} threads, {args.rounds} rounds"
    )
    header = f"{'variant':<10}{'step s':>8}" + "".join(f"{part:>15}" for part in PARTS)
    print(header + f"{'speed-up (min-max) vs ' + first:>30}")
    for name, row in summary.items():
        parts = "".join(f"{row[part]:>15.3f}" for part in PARTS)
        spread = f"{row['speed_up_median']:.2f}x ({row['speed_up_min']:.2f}-{row['speed_up_max']:.2f})"
        print(f"{name:<10}{row['step']:>8.3f}{parts}{spread:>30}")
    print(f"\n{'GEMM GFLOP/s':<34}{'float32':>10}{'bfloat16':>10}")
    for label, rates in gemm.items():
        print(f"{label:<34}{rates['float32']:>10.1f}{rates['bfloat16']:>10.1f}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "config": args.config,
        "overrides": args.overrides,
        "variants": {name: overrides for name, overrides in args.variant},
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "summary": summary,
        "steps": steps,
        "gemm_gflops": gemm,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
