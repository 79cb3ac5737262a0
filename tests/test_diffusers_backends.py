"""SD3 and FLUX through the trainer, on tiny random-weight pipelines built in code (nothing from a hub).

For each backend: an NFT step and a Flow-GRPO step change only the trained
LoRA adapter (and the old one that follows it); the reference (adapters
disabled) and every base weight stay bit-identical; resume is exact; the saved
LoRA loads into a stock diffusers pipeline with ``load_lora_weights`` and
generates the trainer's own images for the same noise.
"""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from two_processes import train_in_two_processes

from flowrl.checkpoint import read_checkpoint
from flowrl.config import ConfigError, load_config
from flowrl.generate import generate
from flowrl.policy import OLD, REFERENCE, build_policy
from flowrl.run_log import read_metrics
from flowrl.testing import save_tiny_pipeline
from flowrl.trainer import Trainer

KINDS = ("sd3", "flux")
PROMPTS = ["a red circle", "two blue squares", "a green triangle above a red circle", "three yellow squares"]
#: images from the trainer's sampler and from the stock pipeline agree to this (max abs, images in [0, 1])
IMAGE_TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=KINDS)
def pipeline_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param) / "pipeline"
    save_tiny_pipeline(request.param, directory)
    return request.param, directory


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def config_for(kind, model_dir, prompts, output_dir, *overrides):
    return load_config(None, overrides_for(kind, model_dir, prompts, output_dir, *overrides))


def overrides_for(kind, model_dir, prompts, output_dir, *overrides):
    """A one-step tiny run (2 prompts x 4 images at 32x32, jpeg reward) of the ``kind`` pipeline."""
    grpo = any(
        override in ("algorithm.name=flow_grpo", "algorithm.name=branch_grpo", "algorithm.name=prdp")
        for override in overrides
    )
    return [
        f"model.backend={kind}",
        f"model.name={model_dir}",
        "model.height=32",
        "model.width=32",
        "model.max_sequence_length=16",
        "model.lora_rank=4",
        "model.lora_alpha=8",
        "sampler.num_steps=4",
        "rewards={jpeg_compressibility: 1.0}",
        *([] if grpo else ["algorithm.train_timesteps=2"]),  # a GRPO section has no NFT keys
        "training.steps=1",
        "training.prompts_per_step=2",
        "training.group_size=4",
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
    ]


def base_weights(transformer):
    return {name: value.clone() for name, value in transformer.state_dict().items() if "lora_" not in name}


@pytest.mark.parametrize("algorithm", ["nft", "flow_grpo", "crd", "fpo", "prdp"])
def test_a_training_step_changes_only_the_lora_weights(pipeline_dir, prompt_file, tmp_path, algorithm):
    kind, model_dir = pipeline_dir
    config = config_for(kind, model_dir, prompt_file, tmp_path / "run", f"algorithm.name={algorithm}")
    trainer = Trainer(config)
    policy = trainer.policy
    transformer = policy.flow_model.transformer
    before = base_weights(transformer)
    frozen_before = {
        name: value.clone()
        for module in (policy.flow_model.vae, *policy.flow_model.text_encoders())
        for name, value in module.state_dict().items()
    }
    adapters_before = policy.state_dict()
    x = torch.randn(2, *policy.sample_shape, generator=torch.Generator().manual_seed(0))
    t, cond = torch.tensor(0.6), policy.encode(PROMPTS[:2])
    with torch.no_grad():
        reference_before = policy.reference_velocity(x, t, cond)

    trainer.train()

    after = base_weights(transformer)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    frozen_after = {
        name: value
        for module in (policy.flow_model.vae, *policy.flow_model.text_encoders())
        for name, value in module.state_dict().items()
    }
    assert all(torch.equal(frozen_before[k], frozen_after[k]) for k in frozen_before)
    adapters_after = policy.state_dict()
    changed = {
        name: sum(not torch.equal(adapters_before[name][k], v) for k, v in adapters_after[name].items())
        for name in adapters_after
    }
    assert changed["default"] > 0, "the trained adapter did not move"
    # NFT's soft update moves the old adapter a little; GRPO, FPO and PRDP copy the trained one after the step.
    assert changed["old"] > 0
    if algorithm in ("flow_grpo", "fpo", "prdp"):
        for key, value in adapters_after["default"].items():
            assert torch.equal(adapters_after["old"][key], value)
    if algorithm == "crd":  # the decoupled rollout adapter copies the trained one for rollout_delay_steps
        assert set(adapters_after) == {"default", "old", "rollout"}
        for key, value in adapters_after["default"].items():
            assert torch.equal(adapters_after["rollout"][key], value)
    assert all(p.dtype == torch.float32 and p.requires_grad for p in policy.trainable_parameters())
    with torch.no_grad():
        assert torch.equal(policy.reference_velocity(x, t, cond), reference_before)
        assert not torch.equal(policy.velocity(x, t, cond), reference_before)
    row = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert row["memory/peak_gb"] > 0 and np.isfinite(row["loss"])
    if algorithm == "flow_grpo":
        assert row["grpo/ratio"] == 1.0 and row["grpo/clip_fraction"] == 0.0
    if algorithm == "fpo":  # one update: the adapters of theta and theta_old are the same weights
        assert row["fpo/ratio"] == 1.0 and row["fpo/clip_fraction"] == 0.0


def test_resume_continues_exactly(pipeline_dir, prompt_file, tmp_path):
    kind, model_dir = pipeline_dir

    def run(name, steps, *extra):
        Trainer(
            config_for(kind, model_dir, prompt_file, tmp_path / name, f"training.steps={steps}", *extra)
        ).train()

    run("straight", 3)
    run("split", 2)
    run("split", 3, "resume=latest")
    _, straight = read_checkpoint(tmp_path / "straight" / "checkpoints" / "step_000003")
    _, split = read_checkpoint(tmp_path / "split" / "checkpoints" / "step_000003")
    for adapter, tensors in straight["policy"].items():
        for key, value in tensors.items():
            assert torch.equal(split["policy"][adapter][key], value), (adapter, key)
    rows = [read_metrics(tmp_path / name / "metrics.jsonl") for name in ("straight", "split")]
    assert [row["step"] for row in rows[1]] == [1, 2, 3]
    for row_a, row_b in zip(*rows, strict=True):
        for key in ("reward/mean", "loss", "grad_norm"):
            assert row_a[key] == row_b[key], (row_a["step"], key)


@pytest.mark.parametrize("guidance_scale", [1.0, 3.0])
def test_the_saved_lora_reproduces_the_trainers_images_in_a_stock_pipeline(
    pipeline_dir, prompt_file, tmp_path, guidance_scale
):
    kind, model_dir = pipeline_dir
    trainer = Trainer(
        config_for(
            kind, model_dir, prompt_file, tmp_path / "run", "training.steps=2", "training.learning_rate=0.02"
        )
    )
    trainer.train()
    lora_file = tmp_path / "run" / "model" / "pytorch_lora_weights.safetensors"
    keys = load_file(lora_file).keys()
    assert keys and all(key.startswith("transformer.") for key in keys)

    seeds, num_steps = [0, 1, 2], 4
    prompts = PROMPTS[: len(seeds)]
    negative = "three yellow squares" if guidance_scale > 1 else ""  # sampler.negative_prompt's path
    ours = generate(trainer.policy, prompts, seeds, num_steps, guidance_scale, negative_prompt=negative)
    base = generate(
        trainer.policy, prompts, seeds, num_steps, guidance_scale, role=REFERENCE, negative_prompt=negative
    )

    pipeline_class = trainer.policy.flow_model.pipeline_class()
    pipe = pipeline_class.from_pretrained(model_dir)
    pipe.load_lora_weights(tmp_path / "run" / "model")
    options = {"guidance_scale": guidance_scale} if kind == "sd3" else {"true_cfg_scale": guidance_scale}
    if kind == "sd3" and guidance_scale > 1:
        options["negative_prompt"] = negative
    if kind == "flux":
        options["guidance_scale"] = 3.5  # the embedded guidance the trainer used (model.guidance)
        if guidance_scale > 1:
            options["negative_prompt"] = negative
    theirs = torch.cat(
        [
            pipe(
                prompt,
                height=32,
                width=32,
                num_inference_steps=num_steps,  # default arguments: the scheduler's own sigmas
                generator=torch.Generator().manual_seed(seed),  # the pipeline draws its own noise
                max_sequence_length=16,
                output_type="pt",
                **options,
            ).images
            for prompt, seed in zip(prompts, seeds)
        ]
    )
    assert (theirs - ours).abs().max() < IMAGE_TOLERANCE
    assert (base - ours).abs().max() > 100 * IMAGE_TOLERANCE, (
        "the LoRA must change the images for this to test it"
    )


def test_full_fine_tuning_trains_the_transformer_and_keeps_a_frozen_reference(
    pipeline_dir, prompt_file, tmp_path
):
    kind, model_dir = pipeline_dir
    trainer = Trainer(config_for(kind, model_dir, prompt_file, tmp_path / "run", "model.lora_rank=0"))
    policy = trainer.policy
    reference = {k: v.clone() for k, v in policy.copies.copies[REFERENCE].state_dict().items()}
    trained_before = {k: v.clone() for k, v in policy.copies.unwrapped.state_dict().items()}
    trainer.train()
    assert all(torch.equal(v, reference[k]) for k, v in policy.copies.copies[REFERENCE].state_dict().items())
    assert any(not torch.equal(v, trained_before[k]) for k, v in policy.copies.unwrapped.state_dict().items())
    assert not any("lora" in name for name in trained_before)
    assert (tmp_path / "run" / "model" / "transformer" / "config.json").is_file()


def test_mixed_precision_keeps_lora_weights_in_float32(pipeline_dir, prompt_file, tmp_path):
    kind, model_dir = pipeline_dir
    trainer = Trainer(config_for(kind, model_dir, prompt_file, tmp_path / "run", "model.dtype=bfloat16"))
    trainer.train()
    policy = trainer.policy
    assert policy.flow_model.transformer.dtype == torch.bfloat16
    assert policy.flow_model.vae.dtype == torch.float32
    # the VAE is read in float32, not rounded to bfloat16 and upcast
    stored = policy.flow_model.pipeline_class().from_pretrained(model_dir, dtype=torch.float32).vae
    assert all(
        torch.equal(a, b)
        for a, b in zip(policy.flow_model.vae.state_dict().values(), stored.state_dict().values())
    )
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())
    assert np.isfinite(read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["loss"])


def test_gradient_checkpointing_gives_the_same_gradients(pipeline_dir, prompt_file, tmp_path):
    """Checkpointing recomputes the trained forward in backward, after the old and reference forwards
    switched adapters: the gradients must be those of the trained adapter all the same."""
    kind, model_dir = pipeline_dir
    config = config_for(kind, model_dir, prompt_file, tmp_path / "run")
    grads = []
    for checkpointing in (False, True):
        config.model.gradient_checkpointing = checkpointing
        torch.manual_seed(0)  # the same LoRA initialisation for both builds
        policy = build_policy(config.model)
        for parameter in policy.trainable_parameters():  # a non-zero LoRA so that adapters differ
            parameter.data.normal_(0, 0.1)
        policy.move_copies({OLD: 0.5})
        x = torch.randn(4, *policy.sample_shape, generator=torch.Generator().manual_seed(1))
        t, cond = torch.tensor(0.7), policy.encode(PROMPTS)
        v = policy.velocity(x, t, cond)
        with torch.no_grad():
            v_old = policy.old_velocity(x, t, cond)
            v_ref = policy.reference_velocity(x, t, cond)
        ((v - v_old) ** 2 + (v - v_ref) ** 2).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_two_processes_train_the_lora_like_one(prompt_file, tmp_path):
    model_dir = save_tiny_pipeline("sd3", tmp_path / "sd3")  # one backend is enough for the distributed path
    overrides = overrides_for(
        "sd3",
        model_dir,
        prompt_file,
        tmp_path / "one",
        "training.steps=2",
        "training.micro_batch_size=2",
        "training.threads=1",
        "logging.checkpoint_every=2",
        # continuous in the pixels: a JPEG size jumps by bytes when the last bits of step 1 move a pixel, and
        # the advantages of step 2 with it
        "rewards={brightness: 1.0}",
    )
    Trainer(load_config(None, overrides)).train()
    empty_config = tmp_path / "empty.yaml"
    empty_config.write_text("{}\n")
    train_in_two_processes(empty_config, [*overrides, f"logging.output_dir={tmp_path / 'two'}"])
    _, one = read_checkpoint(tmp_path / "one" / "checkpoints" / "step_000002")
    _, two = read_checkpoint(tmp_path / "two" / "checkpoints" / "step_000002")
    assert len(two["rng"]) == 2
    for key, value in one["policy"]["default"].items():  # atol 1% of lr: Adam scales up near-zero gradients
        torch.testing.assert_close(two["policy"]["default"][key], value, rtol=1e-4, atol=1e-5)


def test_backend_settings_are_checked_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="model.dtype='bfloat16'.*shapes"):
        load_config(None, ["model.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="model.attention_backend='warp'.*allowed"):
        load_config(None, ["model.backend=sd3", "model.name=somewhere", "model.attention_backend=warp"])
    with pytest.raises(ConfigError, match="model.name=''.*sd3"):
        load_config(None, ["model.backend=sd3"])
    with pytest.raises(ConfigError, match="model.name='shapes-base-v2'.*flux"):
        load_config(None, ["model.backend=flux", "model.name=shapes-base-v2"])
    with pytest.raises(ConfigError, match="sampler.negative_prompt='blurry'.*shapes backend.*allowed: ''"):
        load_config(None, ["sampler.negative_prompt=blurry"])
    with pytest.raises(ConfigError, match="model.height=20.*multiple of 16"):
        load_config(None, ["model.backend=sd3", "model.name=x", "model.height=20"])


def test_a_model_that_is_not_there_is_a_clear_error(tmp_path):
    config = load_config(
        None,
        [
            "model.backend=flux",
            f"model.name={tmp_path / 'missing'}",
            "evaluation.guidance_scales=[]",
            "evaluation.base_guidance_scales=[]",
        ],
    )
    with pytest.raises(OSError, match="could not be loaded as a FluxPipeline"):
        build_policy(config.model)


def test_a_compiled_transformer_switches_adapters_like_the_eager_one(prompt_file, tmp_path):
    """``model.compile`` (torch.compile, ~80 s of compilation on 2 CPU cores) with SDPA set explicitly:
    trained, old and reference velocities equal the eager model's, so compiled graphs follow the
    adapter switches."""
    model_dir = save_tiny_pipeline("sd3", tmp_path / "sd3")
    velocities = []
    for compiled in (False, True):
        config = config_for(
            "sd3",
            model_dir,
            prompt_file,
            tmp_path / "run",
            f"model.compile={str(compiled).lower()}",
            "model.attention_backend=native",
        )
        torch.manual_seed(0)
        policy = build_policy(config.model)
        for parameter in policy.trainable_parameters():
            parameter.data.normal_(0, 0.1)
        x = torch.randn(2, *policy.sample_shape, generator=torch.Generator().manual_seed(0))
        t, cond = torch.tensor(0.5), policy.encode(PROMPTS[:2])
        with torch.no_grad():
            velocities.append(
                [
                    policy.velocity(x, t, cond),
                    policy.old_velocity(x, t, cond),
                    policy.reference_velocity(x, t, cond),
                ]
            )
    eager, compiled = velocities
    assert not torch.allclose(eager[0], eager[1])  # the adapters differ, so a stale graph would show
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_adapters_switched_layer_by_layer_give_what_the_diffusers_api_gives(prompt_file, tmp_path):
    """Each role's velocity through the policy (peft's per-layer switch) is bit-identical to the same
    transformer switched with diffusers' model-level ``set_adapter`` / ``disable_adapters``; after every
    call the trained adapter is the active one and the only trainable weights."""
    model_dir = save_tiny_pipeline("sd3", tmp_path / "sd3")
    policy = build_policy(config_for("sd3", model_dir, prompt_file, tmp_path / "run").model)
    transformer = policy.flow_model.transformer
    with torch.no_grad():  # two different adapters, so a switch that does not happen shows
        for name, parameter in transformer.named_parameters():
            if ".lora_" in name:
                parameter.normal_(0, 0.1)
    x = torch.randn(2, *policy.sample_shape, generator=torch.Generator().manual_seed(0))
    t, cond = torch.tensor(0.5), policy.encode(PROMPTS[:2])
    with torch.no_grad():
        ours = [
            policy.velocity(x, t, cond),
            policy.old_velocity(x, t, cond),
            policy.reference_velocity(x, t, cond),
        ]
        transformer.set_adapter("old")
        old = policy.flow_model.velocity(transformer, x, t, cond)
        transformer.disable_adapters()
        reference = policy.flow_model.velocity(transformer, x, t, cond)
        transformer.enable_adapters()
        transformer.set_adapter("default")
        trained = policy.flow_model.velocity(transformer, x, t, cond)
    assert not torch.equal(trained, old)
    for a, b in zip(ours, (trained, old, reference), strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        policy.old_velocity(x, t, cond), policy.reference_velocity(x, t, cond)
    trainable = {name for name, parameter in transformer.named_parameters() if parameter.requires_grad}
    assert trainable and all(".default." in name for name in trainable)
    assert trainable == {
        name for name in dict(transformer.named_parameters()) if ".lora_" in name and ".default." in name
    }
