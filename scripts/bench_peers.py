"""flowrl against the reference trainers at equal work, interleaved, on one saved tiny SD3 pipeline.

The equal-work setting: the tiny random-weight SD3 pipeline of ``flowrl.testing`` at 64x64,
LoRA rank 32 / alpha 64 on the attention projections, float32, the JPEG-compressibility reward, 2
prompts x 4 images per step, 10 sampling steps, 9 trained timesteps, one optimizer step per step;
Flow-GRPO with CFG 4.5 and its KL term, DiffusionNFT CFG-free with a 2nd-order solver. flowrl's side
is built here; a reference's side is the command you give for your local checkout (nothing is
fetched), with ``{pipeline}``, ``{steps}`` and ``{out}`` filled in:

    python scripts/bench_peers.py --rounds 3 \\
        --peer "flow_grpo=/path/to/flow_grpo::accelerate launch --cpu --num_processes 1 \\
            scripts/train_sd3.py --config config/grpo.py:<your tiny config> \\
            --config.pretrained.model={pipeline} --config.num_epochs={steps} --config.save_dir={out}" \\
        --peer "diffusion_nft=/path/to/DiffusionNFT::..."

A peer is ``name=checkout::command`` (the command runs in ``checkout``); ``flow_grpo`` is compared with
flowrl's Flow-GRPO run and ``diffusion_nft`` with its DiffusionNFT run. A peer whose checkout is missing
is skipped with a line saying so, and without peers only flowrl's own step times are measured.

Per-step time is measured without parsing anyone's logs: each trainer runs ``steps`` and ``2 * steps``
steps, and ``(T(2 steps) - T(steps)) / steps`` removes start-up, loading and evaluation, which both
runs share. Rounds interleave every trainer (flowrl, peer, flowrl, peer, ...); the table gives the
median over rounds, the per-round ratios and each process's peak resident memory (``os.wait4``).
Run it on a quiet machine: never time anything beside another CPU-bound job.

Both sides run in float32 (flowrl's ``training.mixed_precision=no``); ``--fast-path`` adds flowrl's
bfloat16 run of each algorithm beside it, and ``--profile`` runs every trainer once more for S and 2S
steps under ``torch.profiler`` (``op_profile.py``) and prints where a step's time goes by operator
family and the largest operators, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import op_profile

ROOT = Path(__file__).resolve().parent.parent
#: a peer's name -> the flowrl algorithm it is compared with
PEER_ALGORITHMS = {"flow_grpo": "flow_grpo", "diffusion_nft": "nft"}
PLACEHOLDERS = ("{pipeline}", "{steps}", "{out}")

EQUAL_WORK = [
    "model.backend=sd3",
    "model.height=64",
    "model.width=64",
    "model.max_sequence_length=16",
    "model.lora_rank=32",
    "model.lora_alpha=64",
    "model.dtype=float32",
    "training.mixed_precision=no",
    "rewards={jpeg_compressibility: 1.0}",
    "training.prompts_per_step=2",
    "training.group_size=4",
    "training.micro_batch_size=8",
    "training.updates_per_step=1",
    "sampler.num_steps=10",
    "logging.sample_every=0",
    "logging.checkpoint_every=0",
    "logging.progress=false",
    "evaluation.guidance_scales=[]",
    "evaluation.base_guidance_scales=[]",
]
ALGORITHM_SETTINGS = {
    "flow_grpo": [
        "algorithm.name=flow_grpo",
        "sampler.guidance_scale=4.5",
        "algorithm.train_guidance=true",
        "algorithm.timestep_fraction=0.9",
        "algorithm.kl_weight=0.04",
    ],
    "nft": [
        "algorithm.name=nft",
        "sampler.solver=dpm2m",
        "sampler.guidance_scale=1.0",
        "algorithm.train_timesteps=9",
    ],
}


@dataclass
class Trainer:
    """One side of the comparison: a command template run in a folder."""

    name: str
    folder: Path
    template: str

    def command(self, pipeline: Path, steps: int, out: Path) -> list[str]:
        filled = self.template
        for key, value in (("{pipeline}", pipeline), ("{steps}", steps), ("{out}", out)):
            filled = filled.replace(key, str(value))
        return shlex.split(filled)


def parse_peer(text: str) -> Trainer:
    """``name=checkout::command`` with every placeholder; a ``ValueError`` naming what is wrong."""
    name, separator, rest = text.partition("=")
    folder, separator2, template = rest.partition("::")
    if not (separator and separator2 and template.strip()):
        raise ValueError(f"--peer {text!r} is not name=checkout::command")
    if name not in PEER_ALGORITHMS:
        raise ValueError(f"--peer name {name!r} is not allowed; allowed: {sorted(PEER_ALGORITHMS)}")
    missing = [key for key in PLACEHOLDERS if key not in template]
    if missing:
        raise ValueError(f"--peer {name}: the command lacks {missing}; it needs {list(PLACEHOLDERS)}")
    return Trainer(name, Path(folder).expanduser(), template)


def flowrl_trainer(algorithm: str, prompts: Path, empty_config: Path, fast_path: bool = False) -> Trainer:
    """flowrl's side of the comparison for ``algorithm``, as a command template (every setting an
    override of the defaults); ``fast_path``: in bfloat16 mixed precision (``flowrl_<algorithm>_bf16``)."""
    overrides = [*EQUAL_WORK, *ALGORITHM_SETTINGS[algorithm], f"data.prompts={prompts}"]
    if fast_path:
        overrides.append("training.mixed_precision=bf16")
    template = " ".join(
        shlex.quote(part)
        for part in [sys.executable, "-m", "flowrl.cli", "train", str(empty_config), *overrides]
    )
    return Trainer(
        f"flowrl_{algorithm}" + ("_bf16" if fast_path else ""),
        ROOT,
        template + " model.name={pipeline} training.steps={steps} logging.output_dir={out}",
    )


def timed_run(
    trainer: Trainer, pipeline: Path, steps: int, scratch: Path, profile_to: Path | None = None
) -> tuple[float, float]:
    """``(seconds, peak resident GiB)`` of one run of ``trainer`` for ``steps`` steps; with ``profile_to``,
    under the operator profiler, which writes there."""
    out = Path(tempfile.mkdtemp(prefix=f"{trainer.name}-", dir=scratch))
    out.rmdir()  # the trainer creates it
    command, environment = trainer.command(pipeline, steps, out), None
    if profile_to is not None:
        profile_to.mkdir(parents=True)
        command, environment = op_profile.hooked(command, op_profile.write_hook(scratch / "hook"), profile_to)
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=trainer.folder,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(
            f"{trainer.name} failed (exit {process.returncode}): {process.stderr.read()[-2000:]!r}"
        )
    return seconds, usage.ru_maxrss / 2**20


def profile_steps(
    trainers: list[Trainer], pipeline: Path, steps: int, scratch: Path, top: int = 12
) -> dict[str, dict[str, Any]]:
    """Each trainer's per-step self CPU seconds by operator family and its ``top`` operators (a run of
    ``steps`` and one of ``2 * steps`` under the profiler); printed side by side."""
    profiles = {}
    for trainer in trainers:
        times = []
        for count in (steps, 2 * steps):
            folder = scratch / "profiles" / f"{trainer.name}-{count}"
            timed_run(trainer, pipeline, count, scratch, profile_to=folder)
            times.append(op_profile.operator_times(folder))
        operators = op_profile.per_step(*times, steps)
        ranked = [
            item for item in operators.items() if item[0] not in (op_profile.WALL, op_profile.PROCESS_CPU)
        ]
        largest = sorted(ranked, key=lambda item: -item[1][0])[:top]
        profiles[trainer.name] = {
            "wall_s": operators.get(op_profile.WALL, (0.0, 0))[0],
            "process_cpu_s": operators.get(op_profile.PROCESS_CPU, (0.0, 0))[0],
            "families": op_profile.by_category(operators),
            "operators": {name: {"seconds": seconds, "calls": calls} for name, (seconds, calls) in largest},
        }
    names = list(profiles)
    families = sorted({family for profile in profiles.values() for family in profile["families"]})
    print("\nself CPU seconds per step, by operator family (profiled; shares beside)")
    print(f"{'family':<18}" + "".join(f"{name:>26}" for name in names))
    for family in families:
        cells = []
        for name in names:
            seconds = profiles[name]["families"].get(family, 0.0)
            total = sum(profiles[name]["families"].values())
            cells.append(f"{seconds:>18.3f} ({seconds / total:>4.0%})")
        print(f"{family:<18}" + "".join(cells))
    print(f"{'step wall-clock':<18}" + "".join(f"{profiles[name]['wall_s']:>26.3f}" for name in names))
    print(f"{'process CPU':<18}" + "".join(f"{profiles[name]['process_cpu_s']:>26.3f}" for name in names))
    for name in names:
        print(f"\n{name}: largest operators, s/step and calls/step")
        for operator, row in profiles[name]["operators"].items():
            print(f"  {row['seconds']:8.3f} {row['calls']:8.0f}  {operator}")
    return profiles


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer", action="append", default=[], help="name=checkout::command (repeat)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (0: only --profile)")
    parser.add_argument(
        "--steps",
        type=int,
        default=6,
        help="S: each trainer runs S and 2S steps per round (small S: start-up noise)",
    )
    parser.add_argument("--fast-path", action="store_true", help="add flowrl's bfloat16 runs beside them")
    parser.add_argument(
        "--profile", action="store_true", help="then profile every trainer's step by operator (op_profile.py)"
    )
    parser.add_argument("--out", default="outputs/bench_peers.json")
    args = parser.parse_args()
    if args.rounds < 0 or (args.rounds == 0 and not args.profile):
        parser.error(f"--rounds {args.rounds}: at least 1, or 0 with --profile")
    peers = [parse_peer(text) for text in args.peer]
    present = []
    for peer in peers:
        if peer.folder.is_dir():
            present.append(peer)
        else:
            print(f"skipping {peer.name}: no checkout at {peer.folder}")
    algorithms = sorted({PEER_ALGORITHMS[peer.name] for peer in present}) or sorted(ALGORITHM_SETTINGS)
    from flowrl.testing import save_tiny_pipeline

    with tempfile.TemporaryDirectory(prefix="flowrl-peers-") as folder:
        scratch = Path(folder)
        pipeline = save_tiny_pipeline("sd3", scratch / "pipeline")
        prompts = scratch / "prompts.txt"
        prompts.write_text("a photo of a cat\na red bicycle\n")
        empty_config = scratch / "defaults.yaml"
        empty_config.write_text("{}\n")
        trainers = [
            flowrl_trainer(algorithm, prompts, empty_config, fast)
            for algorithm in algorithms
            for fast in ((False, True) if args.fast_path else (False,))
        ] + present
        times: dict[str, list[float]] = {trainer.name: [] for trainer in trainers}
        memory: dict[str, list[float]] = {trainer.name: [] for trainer in trainers}
        for round_index in range(args.rounds):
            for trainer in trainers:  # interleaved: every trainer once per round
                short, peak_short = timed_run(trainer, pipeline, args.steps, scratch)
                long, peak_long = timed_run(trainer, pipeline, 2 * args.steps, scratch)
                times[trainer.name].append((long - short) / args.steps)
                memory[trainer.name].append(max(peak_short, peak_long))
                print(
                    f"round {round_index + 1}: {trainer.name} {times[trainer.name][-1]:.2f} s/step",
                    flush=True,
                )
        profiles = profile_steps(trainers, pipeline, args.steps, scratch) if args.profile else {}
    rows = []
    for peer in present if args.rounds else []:
        ours = f"flowrl_{PEER_ALGORITHMS[peer.name]}"
        ratios = [a / b for a, b in zip(times[ours], times[peer.name])]
        fast = [a / b for a, b in zip(times.get(f"{ours}_bf16", []), times[peer.name])]
        rows.append(
            {
                "peer": peer.name,
                "flowrl_s_per_step": statistics.median(times[ours]),
                "peer_s_per_step": statistics.median(times[peer.name]),
                "ratio_median": statistics.median(ratios),
                "ratios": ratios,
                "fast_path_ratio_median": statistics.median(fast) if fast else None,
                "fast_path_ratios": fast,
                "flowrl_peak_gib": max(memory[ours]),
                "peer_peak_gib": max(memory[peer.name]),
            }
        )
    if args.rounds:
        print(f"\n{'trainer':<20}{'s/step (median)':>16}{'peak GiB':>10}")
        for name, values in times.items():
            print(f"{name:<20}{statistics.median(values):>16.2f}{max(memory[name]):>10.2f}")
    for row in rows:
        print(
            f"flowrl / {row['peer']}: {row['ratio_median']:.2f}x (rounds: "
            f"{', '.join(f'{r:.2f}' for r in row['ratios'])}); peak {row['flowrl_peak_gib']:.2f} vs "
            f"{row['peer_peak_gib']:.2f} GiB"
            + (f"; bf16 fast path {row['fast_path_ratio_median']:.2f}x" if row["fast_path_ratios"] else "")
        )
    record = {
        "rounds": args.rounds,
        "steps": args.steps,
        "trainers": {
            name: {"s_per_step": values, "peak_gib": memory[name]} for name, values in times.items()
        },
        "comparisons": rows,
        "profiles": profiles,
        "peer_commands": {peer.name: peer.template for peer in present},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
