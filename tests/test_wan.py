"""Wan 2.1 text-to-video through the trainer, on a tiny random-weight pipeline built in code.

An NFT step and a Flow-GRPO step on 5-frame clips change only the LoRA
adapters (the transformer's base weights, the VAE and the UMT5 encoder stay
bit-identical); the saved LoRA loads into a stock ``WanPipeline`` with
``load_lora_weights`` and generates the trainer's own video for a seed, with
and without CFG; ``num_frames: 1`` trains on single frames; a frame count
the VAE cannot take is a clear error.
"""

import copy

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from safetensors.torch import load_file

from flowrl.config import ConfigError, load_config
from flowrl.generate import generate
from flowrl.models.wan import WanModel
from flowrl.policy import REFERENCE
from flowrl.run_log import read_metrics
from flowrl.testing import save_tiny_pipeline, tiny_wan_pipeline
from flowrl.trainer import Trainer

PROMPTS = ["a red circle", "two blue squares", "a green triangle above a red circle", "three yellow squares"]
SIZE = 32
#: videos from the trainer's sampler and from the stock pipeline agree to this (max abs, pixels in [0, 1])
VIDEO_TOLERANCE = 1e-4
FRAME_REWARD = "{frames: {reward: frame_average, settings: {reward: jpeg_compressibility, num_frames: 2}}"
#: single-frame rewards, and with the clip's temporal consistency for clips of several frames
REWARDS = {1: FRAME_REWARD + "}", 5: FRAME_REWARD + ", motion: {reward: temporal_consistency, weight: 0.5}}"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_pipeline("wan", tmp_path_factory.mktemp("wan") / "pipeline")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def config_for(model_dir, prompts, output_dir, num_frames, *overrides):
    """A one-step tiny run: 2 prompts x 2 clips of ``num_frames`` frames at 32x32, 4 sampling steps."""
    return load_config(
        None,
        [
            "model.backend=wan",
            f"model.name={model_dir}",
            f"model.height={SIZE}",
            f"model.width={SIZE}",
            f"model.num_frames={num_frames}",
            "model.max_sequence_length=16",
            "model.lora_rank=4",
            "model.lora_alpha=8",
            "sampler.num_steps=4",
            f"rewards={REWARDS[num_frames]}",
            *([] if "algorithm.name=flow_grpo" in overrides else ["algorithm.train_timesteps=2"]),
            "training.steps=1",
            "training.prompts_per_step=2",
            "training.group_size=2",
            "training.micro_batch_size=4",
            "training.learning_rate=0.001",
            f"data.prompts={prompts}",
            f"logging.output_dir={output_dir}",
            "logging.sample_every=0",
            "logging.checkpoint_every=1",
            "logging.progress=false",
            "evaluation.guidance_scales=[]",
            "evaluation.base_guidance_scales=[]",
            *overrides,
        ],
    )


def frozen_weights(policy):
    """Every weight that must not train: the transformer's base weights, the VAE and the text encoder."""
    backend = policy.flow_model
    weights = {
        f"transformer.{name}": value.clone()
        for name, value in backend.transformer.state_dict().items()
        if "lora_" not in name
    }
    for prefix, module in (("vae", backend.vae), ("text_encoder", backend.pipeline.text_encoder)):
        weights.update({f"{prefix}.{name}": value.clone() for name, value in module.state_dict().items()})
    return weights


@pytest.mark.parametrize("algorithm", ["nft", "flow_grpo"])
def test_a_training_step_changes_only_the_lora_weights(model_dir, prompt_file, tmp_path, algorithm):
    overrides = (f"algorithm.name={algorithm}", "logging.sample_every=1")
    trainer = Trainer(config_for(model_dir, prompt_file, tmp_path / "run", 5, *overrides))
    policy = trainer.policy
    assert policy.sample_shape == (16, 2, SIZE // 8, SIZE // 8)  # 5 frames -> 2 latent frames
    assert policy.time_shift == 3.0  # the UniPC scheduler's flow_shift, as Wan 2.1 ships it at 480p
    before, adapters_before = frozen_weights(policy), policy.state_dict()
    x = torch.randn(2, *policy.sample_shape, generator=torch.Generator().manual_seed(0))
    t, cond = torch.tensor(0.6), policy.encode(PROMPTS[:2])
    with torch.no_grad():
        reference_before = policy.reference_velocity(x, t, cond)

    trainer.train()

    after = frozen_weights(policy)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    adapters_after = policy.state_dict()
    changed = {
        name: sum(not torch.equal(adapters_before[name][k], v) for k, v in adapters_after[name].items())
        for name in adapters_after
    }
    assert changed["default"] > 0 and changed["old"] > 0
    with torch.no_grad():
        assert torch.equal(policy.reference_velocity(x, t, cond), reference_before)
        assert not torch.equal(policy.velocity(x, t, cond), reference_before)
    assert any((tmp_path / "run" / "samples").iterdir()), "the step's sample clips were not written"
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert np.isfinite(row["loss"]) and 0.0 <= row["reward/motion"] <= 1.0
    if algorithm == "flow_grpo":
        assert row["grpo/ratio"] == 1.0


class StockGridEuler(FlowMatchEulerDiscreteScheduler):
    """Flow-matching Euler on the sigmas of Wan's own UniPC scheduler for N steps (the trainer's default grid).

    Wan ships a UniPC multistep scheduler (2nd order), which cannot follow our
    Euler steps, and ``WanPipeline.__call__`` takes no ``sigmas``: so the grid
    is set here, where the pipeline asks the scheduler for its timesteps.
    """

    def __init__(self, stock_scheduler) -> None:
        super().__init__(shift=1.0)  # the stock sigmas are shifted already
        self.stock_scheduler = stock_scheduler

    def set_timesteps(self, num_inference_steps: int, device=None, **kwargs) -> None:
        stock = copy.deepcopy(self.stock_scheduler)
        stock.set_timesteps(num_inference_steps)
        super().set_timesteps(num_inference_steps, device, sigmas=list(stock.sigmas[:-1].tolist()), **kwargs)


@pytest.mark.parametrize("num_frames", [5, 1])
def test_the_saved_lora_reproduces_the_trainers_videos_in_a_stock_pipeline(
    model_dir, prompt_file, tmp_path, num_frames
):
    trainer = Trainer(
        config_for(
            model_dir,
            prompt_file,
            tmp_path / "run",
            num_frames,
            "training.steps=2",
            "training.learning_rate=0.05",  # the tiny VAE barely moves a lone first frame
        )
    )
    trainer.train()
    keys = load_file(tmp_path / "run" / "model" / "pytorch_lora_weights.safetensors").keys()
    assert keys and all(key.startswith("transformer.") for key in keys)

    pipe = WanModel.pipeline_class().from_pretrained(model_dir)
    pipe.load_lora_weights(tmp_path / "run" / "model")
    stock_sigmas = copy.deepcopy(pipe.scheduler)
    stock_sigmas.set_timesteps(4)
    torch.testing.assert_close(trainer.policy.time_grid(4), torch.as_tensor(stock_sigmas.sigmas).float())
    pipe.scheduler = StockGridEuler(pipe.scheduler)
    seeds, num_steps = [0, 1], 4
    prompts = PROMPTS[: len(seeds)]
    # CFG 3 against the pipeline's default (empty) negative prompt and against a given one
    for guidance_scale, negative in ((1.0, ""), (3.0, ""), (3.0, "three yellow squares")):
        ours = generate(trainer.policy, prompts, seeds, num_steps, guidance_scale, negative_prompt=negative)
        assert ours.shape == (len(seeds), num_frames, 3, SIZE, SIZE)
        theirs = torch.cat(
            [
                pipe(
                    prompt,
                    height=SIZE,
                    width=SIZE,
                    num_frames=num_frames,
                    num_inference_steps=num_steps,
                    guidance_scale=guidance_scale,
                    negative_prompt=negative or None,
                    generator=torch.Generator().manual_seed(seed),  # the pipeline draws its own noise
                    max_sequence_length=16,
                    output_type="pt",
                ).frames
                for prompt, seed in zip(prompts, seeds)
            ]
        )
        assert (theirs - ours).abs().max() < VIDEO_TOLERANCE, (guidance_scale, negative)
    base = generate(trainer.policy, prompts, seeds, num_steps, role=REFERENCE)
    ours = generate(trainer.policy, prompts, seeds, num_steps)
    assert (base - ours).abs().max() > 10 * VIDEO_TOLERANCE, "the LoRA must change the videos to test it"


def test_a_frame_count_the_vae_cannot_take_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"model.num_frames=8 is not allowed; Wan needs 4k\+1 frames"):
        load_config(None, ["model.backend=wan", "model.name=somewhere", "model.num_frames=8"])
    with pytest.raises(ConfigError, match="model.num_frames=0 is not allowed"):
        load_config(None, ["model.backend=wan", "model.name=somewhere", "model.num_frames=0"])
    with pytest.raises(ValueError, match=r"num_frames=6 is not allowed; Wan needs 4k\+1 frames"):
        WanModel(tiny_wan_pipeline(), SIZE, SIZE, num_frames=6)
