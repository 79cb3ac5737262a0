"""Benchmark the diffusers backends: step time, peak memory and trainable parameters.

Part 1 (measured): the tiny random-weight SD3 and FLUX pipelines of
``flowrl.testing`` trained by the real trainer (DiffusionNFT, 2 prompts x
4 images at 64x64, 2 trained timesteps), LoRA (rank 32, the attention
projections) and full fine-tuning, each with and without gradient
checkpointing. Every configuration runs in its own process: the median
seconds per training step and per loss+backward after a warm-up step, and
the peak memory of training: on CUDA ``max_memory_allocated``, on the CPU the
rise of the process's peak resident set over its size before training.

Part 2 (counted, no weights): the real SD3.5-Medium, SD3.5-Large and
FLUX.1-dev transformers built from their published ``config.json`` on the
meta device, with the same LoRA adapters: total, LoRA-trainable and
fully-trainable parameters, and the bf16/fp32 bytes they imply.

    python scripts/bench_models.py --out outputs/bench_models.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from roofline import PhaseCounter, peak_gemm_rate, roofline_rows

from flowrl.config import load_config
from flowrl.testing import KINDS, save_tiny_pipeline
from flowrl.trainer import Trainer
from rewards import AsyncScorer

#: the transformers' published configs (huggingface.co/<id>/blob/main/transformer/config.json)
REAL_TRANSFORMERS = {
    "stabilityai/stable-diffusion-3.5-medium": (
        "SD3Transformer2DModel",
        {
            "attention_head_dim": 64,
            "caption_projection_dim": 1536,
            "dual_attention_layers": list(range(13)),
            "in_channels": 16,
            "joint_attention_dim": 4096,
            "num_attention_heads": 24,
            "num_layers": 24,
            "out_channels": 16,
            "patch_size": 2,
            "pooled_projection_dim": 2048,
            "pos_embed_max_size": 384,
            "qk_norm": "rms_norm",
            "sample_size": 128,
        },
    ),
    "stabilityai/stable-diffusion-3.5-large": (
        "SD3Transformer2DModel",
        {
            "attention_head_dim": 64,
            "caption_projection_dim": 2432,
            "in_channels": 16,
            "joint_attention_dim": 4096,
            "num_attention_heads": 38,
            "num_layers": 38,
            "out_channels": 16,
            "patch_size": 2,
            "pooled_projection_dim": 2048,
            "pos_embed_max_size": 192,
            "qk_norm": "rms_norm",
            "sample_size": 128,
        },
    ),
    "black-forest-labs/FLUX.1-dev": (
        "FluxTransformer2DModel",
        {
            "attention_head_dim": 128,
            "guidance_embeds": True,
            "in_channels": 64,
            "joint_attention_dim": 4096,
            "num_attention_heads": 24,
            "num_layers": 19,
            "num_single_layers": 38,
            "patch_size": 1,
            "pooled_projection_dim": 768,
            "axes_dims_rope": [16, 56, 56],
        },
    ),
}
LORA_RANK = 32
PROMPTS = ["a red circle", "two blue squares", "a green triangle above a red circle", "three yellow squares"]


def worker(kind: str, lora: bool, checkpointing: bool, model_dir: str, work_dir: str, steps: int) -> dict:
    """Train ``steps`` NFT steps in this process; the JSON row of part 1."""
    prompts = Path(work_dir) / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    config = load_config(
        None,
        [
            f"model.backend={kind}",
            f"model.name={model_dir}",
            "model.height=64",
            "model.width=64",
            "model.max_sequence_length=16",
            f"model.lora_rank={LORA_RANK if lora else 0}",
            f"model.lora_alpha={2 * LORA_RANK}",
            f"model.gradient_checkpointing={str(checkpointing).lower()}",
            "sampler.num_steps=4",
            "rewards={jpeg_compressibility: 1.0}",
            "algorithm.train_timesteps=2",
            f"training.steps={steps}",
            "training.prompts_per_step=2",
            "training.group_size=4",
            "training.micro_batch_size=8",
            f"data.prompts={prompts}",
            f"logging.output_dir={Path(work_dir) / 'run'}",
            "logging.sample_every=0",
            "logging.checkpoint_every=0",
            "logging.progress=false",
            "evaluation.guidance_scales=[]",
            "evaluation.base_guidance_scales=[]",
        ],
    )
    trainer = Trainer(config)
    device = trainer.accelerator.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    resident_before = _resident_gib()
    trainer.train()
    from flowrl.run_log import read_metrics

    rows = read_metrics(Path(work_dir) / "run" / "metrics.jsonl")[1:]  # the first step warms up
    roofline = counted_roofline(
        trainer,
        {
            "rollout": statistics.median(row["time/rollout"] for row in rows),
            "training": statistics.median(row["time/loss_backward"] for row in rows),
        },
    )
    if device.type == "cuda":
        peak = max(row["memory/peak_gb"] for row in rows)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 - resident_before
    return {
        "model": f"tiny-{kind}",
        "training": "lora" if lora else "full",
        "gradient_checkpointing": checkpointing,
        "trainable_parameters": sum(p.numel() for p in trainer.policy.trainable_parameters()),
        "transformer_parameters": sum(
            p.numel()
            for name, p in trainer.policy.flow_model.transformer.named_parameters()
            if "lora_" not in name
        ),
        "seconds_per_step": statistics.median(row["time/step"] for row in rows),
        "seconds_loss_backward": statistics.median(row["time/loss_backward"] for row in rows),
        "peak_memory_gib": peak,
        "memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else "CPU peak RSS rise",
        "device": str(device),
        "roofline": roofline,
    }


def counted_roofline(trainer: Trainer, seconds: dict[str, float]) -> list[dict]:
    """One more step with its rollout and training (loss forward + backward) FLOPs counted, set against the
    phases' median seconds and a bare GEMM at their shapes (:mod:`roofline`)."""
    counter = PhaseCounter()
    trainer.rollout_and_score = counter.count("rollout", trainer.rollout_and_score)
    trainer.algorithm.loss = counter.count("training", trainer.algorithm.loss)
    trainer.accelerator.backward = counter.count("training", trainer.accelerator.backward)
    with AsyncScorer(trainer.reward) as scorer:
        trainer.step += 1
        trainer.train_step(scorer)
    return roofline_rows(dict(counter.flops), seconds, counter.shapes, peak_gemm_rate())


def _resident_gib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**30


def count_real_transformers() -> list[dict]:
    """Part 2: parameter counts of the real transformers with and without LoRA, built on the meta device."""
    import diffusers
    from accelerate import init_empty_weights
    from peft import LoraConfig

    from flowrl.models.flux import FluxModel
    from flowrl.models.sd3 import SD3Model

    rows = []
    for model_id, (class_name, config) in REAL_TRANSFORMERS.items():
        with init_empty_weights():
            transformer = getattr(diffusers, class_name).from_config(config)
        total = sum(p.numel() for p in transformer.parameters())
        targets = (SD3Model if class_name.startswith("SD3") else FluxModel).default_lora_targets
        transformer.add_adapter(
            LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=list(targets))
        )
        lora = sum(p.numel() for name, p in transformer.named_parameters() if "lora_" in name)
        rows.append(
            {
                "model": model_id,
                "transformer_parameters": total,
                "lora_rank": LORA_RANK,
                "lora_trainable_parameters": lora,
                "lora_share": lora / total,
                "full_trainable_parameters": total,
                "bf16_weights_gib": total * 2 / 2**30,
                # full fine-tuning with AdamW in fp32: weights + gradients + two moments = 16 bytes/parameter
                "full_ft_fp32_adamw_gib": total * 16 / 2**30,
                # the same sharded by FSDP over 8 GPUs (flowrl's frozen old/reference copies are not sharded)
                "full_ft_fsdp8_per_gpu_gib": total * 16 / 8 / 2**30,
                "lora_fp32_adamw_gib": lora * 16 / 2**30,
            }
        )
    return rows


def print_tables(measured: list[dict], counted: list[dict]) -> None:
    print("\nPart 1 — tiny models, NFT step (2 prompts x 4 images, 64x64), median after a warm-up step")
    header = f"{'model':<10}{'training':<10}{'ckpt':<6}{'trainable':>12}{'s/step':>9}{'s loss+bwd':>12}{'peak GiB':>10}"
    print(header)
    for row in measured:
        print(
            f"{row['model']:<10}{row['training']:<10}{'on' if row['gradient_checkpointing'] else 'off':<6}"
            f"{row['trainable_parameters']:>12,}{row['seconds_per_step']:>9.3f}{row['seconds_loss_backward']:>12.3f}"
            f"{row['peak_memory_gib']:>10.3f}"
        )
    print(f"(peak memory: {measured[0]['memory_kind']})")
    print("\nroofline of the same runs: achieved GFLOP/s and share of a bare GEMM at the phase's own shapes")
    print(
        f"{'model':<10}{'training':<10}{'ckpt':<6}{'rollout':>9}{'of same':>9}{'training':>10}{'of same':>9}"
    )
    for row in measured:
        phases = {line["phase"]: line for line in row["roofline"]}
        print(
            f"{row['model']:<10}{row['training']:<10}{'on' if row['gradient_checkpointing'] else 'off':<6}"
            f"{phases['rollout']['achieved_gflops']:>9.1f}{phases['rollout']['of_same_shape']:>9.0%}"
            f"{phases['training']['achieved_gflops']:>10.1f}{phases['training']['of_same_shape']:>9.0%}"
        )
    print(
        f"\nPart 2 — real transformers, LoRA rank {LORA_RANK} on the attention projections (counted, no weights)"
    )
    print(
        f"{'model':<42}{'params':>9}{'LoRA':>12}{'share':>8}{'bf16 GiB':>10}{'full AdamW GiB':>16}{'FSDP x8 /GPU':>14}"
    )
    for row in counted:
        print(
            f"{row['model']:<42}{row['transformer_parameters'] / 1e9:>8.2f}B{row['lora_trainable_parameters']:>12,}"
            f"{row['lora_share']:>8.2%}{row['bf16_weights_gib']:>10.1f}{row['full_ft_fp32_adamw_gib']:>16.1f}"
            f"{row['full_ft_fsdp8_per_gpu_gib']:>14.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/bench_models.json")
    parser.add_argument(
        "--steps", type=int, default=4, help="training steps per configuration (the first warms up)"
    )
    parser.add_argument("--worker", nargs=5, metavar=("KIND", "LORA", "CKPT", "MODEL_DIR", "WORK_DIR"))
    args = parser.parse_args()
    if args.worker:
        kind, lora, checkpointing, model_dir, work_dir = args.worker
        row = worker(kind, lora == "1", checkpointing == "1", model_dir, work_dir, args.steps)
        print("BENCH_ROW " + json.dumps(row))
        return

    measured = []
    with tempfile.TemporaryDirectory() as scratch:
        for kind in KINDS:
            model_dir = save_tiny_pipeline(kind, Path(scratch) / kind)
            for lora in (True, False):
                for checkpointing in (False, True):
                    work_dir = Path(scratch) / f"{kind}-{lora}-{checkpointing}"
                    work_dir.mkdir()
                    command = [sys.executable, __file__, "--steps", str(args.steps), "--worker", kind]
                    command += [str(int(lora)), str(int(checkpointing)), str(model_dir), str(work_dir)]
                    result = subprocess.run(command, capture_output=True, text=True, check=False)
                    lines = [line for line in result.stdout.splitlines() if line.startswith("BENCH_ROW ")]
                    if result.returncode or not lines:
                        raise RuntimeError(
                            f"benchmark worker failed: {' '.join(command)}\n{result.stderr[-3000:]}"
                        )
                    measured.append(json.loads(lines[-1].removeprefix("BENCH_ROW ")))
                    print(
                        f"measured {kind} {'lora' if lora else 'full'} checkpointing={checkpointing}",
                        flush=True,
                    )
    counted = count_real_transformers()
    print_tables(measured, counted)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tiny_models": measured, "real_transformers": counted}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
