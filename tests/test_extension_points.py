"""Adding an algorithm or a backend touches only its own code and one registry line.

A toy algorithm (flow matching on the better half of each group, a RAFT-like rule) and a toy backend
(a 3x8x8 linear velocity model) are written here, registered with one call each, and trained through
the real trainer; no edit of ``flowrl/config.py`` or ``flowrl/trainer.py`` is needed. Their config
dataclasses bring their own keys and checks.
"""

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from flowrl.algorithms import ALGORITHMS, Algorithm, AlgorithmConfig, RolloutChunk, StepEnd, TrainRows
from flowrl.algorithms.base import weighted_mean
from flowrl.config import ConfigError, load_config
from flowrl.config_schema import at_least
from flowrl.models import BACKENDS
from flowrl.models.noise import seeded_noise
from flowrl.policy import OLD
from flowrl.run_log import read_metrics
from flowrl.trainer import Trainer
from flowrl.weight_copies import ModuleCopies
from samplers import euler, timesteps


@dataclass
class ToyConfig(AlgorithmConfig):
    name: str = "toy"
    #: times per sample trained per step
    passes: int = field(default=1, metadata=at_least(1))

    def check(self, config):
        if self.passes > config.sampler.num_steps:
            raise ConfigError(f"algorithm.passes={self.passes} is more than sampler.num_steps")


class ToyAlgorithm(Algorithm):
    """Flow matching ``||v_theta(x_t) - (eps - x0)||²`` on samples with a positive advantage."""

    def __init__(self, config):
        super().__init__(config)
        self.passes = self.config.passes

    def rollout(self, velocity, noise, grid, cond, generator, step):
        return RolloutChunk(euler(velocity, noise, grid, cond).x0)

    def training_rows(self, chunks, advantages, rewards, step):
        x0 = torch.cat([chunk.x0 for chunk in chunks])
        return TrainRows({"x0": x0}, torch.arange(x0.shape[0]), advantages, (advantages > 0).float())

    def draw(self, generator, num_samples, sample_shape, grid, step):
        return {
            "t": torch.rand(self.passes, num_samples, generator=generator),
            "noise": torch.randn(self.passes, num_samples, *sample_shape, generator=generator),
        }

    def loss(self, policy, batch, pass_index, step):
        x0, t, noise = batch.x0, batch.draws["t"][pass_index], batch.draws["noise"][pass_index]
        column = t.view(-1, *([1] * (x0.ndim - 1)))
        x_t = (1 - column) * x0 + column * noise
        error = ((policy.velocity(x_t, t, batch.cond) - (noise - x0)) ** 2).mean(dim=(1, 2, 3))
        return weighted_mean(error, batch.weights), {"toy/error": error.detach()}

    def after_optimizer_step(self, step):
        return StepEnd({OLD: 0.0}, {"toy/step": float(step)})


@dataclass
class ToyModelConfig:
    name: str = "toy"
    backend: str = "toy"
    channels: int = field(default=3, metadata=at_least(1))


class ToyVelocity(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.layer = nn.Conv2d(channels + 2, channels, 3, padding=1)

    def forward(self, x, t, prompt_feature):
        planes = [t.expand(x.shape[0]).view(-1, 1, 1, 1), prompt_feature.view(-1, 1, 1, 1)]
        return self.layer(torch.cat([x, *(p.expand(-1, 1, *x.shape[2:]) for p in planes)], dim=1))


class ToyFlowModel:
    config_class = ToyModelConfig
    renders_world = False
    generate_batch_size = 8
    time_shift = 1.0
    mean_flow = False

    def __init__(self, network, channels):
        self.network, self.channels = network, channels

    @classmethod
    def check(cls, config):
        if config.evaluation.guidance_scales or config.evaluation.base_guidance_scales:
            raise ConfigError("the toy backend has no world to evaluate in; set evaluation scales to []")

    @classmethod
    def from_config(cls, config):
        torch.manual_seed(0)
        return cls(ToyVelocity(config.channels), config.channels)

    def weight_copies(self, config, roles):
        return ModuleCopies(self.network, roles)

    @property
    def sample_shape(self):
        return (self.channels, 8, 8)

    @property
    def device(self):
        return next(self.network.parameters()).device

    def to(self, device):
        self.network.to(device)
        return self

    def encode(self, prompts):
        return torch.tensor([len(prompt) / 40.0 for prompt in prompts])

    def velocity(self, network, x, t, cond):
        return network(x, t, cond)

    def decode(self, x):
        return ((x.float() + 1) / 2).clamp(0, 1)

    def time_grid(self, num_steps):
        return timesteps(num_steps)

    def initial_noise(self, seeds, device):
        return seeded_noise(seeds, self.sample_shape, device)

    def save_network(self, network, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        save_file(network.state_dict(), directory / "toy.safetensors")


@pytest.fixture
def toy_registered(monkeypatch):
    """The one registry line of each (``register_algorithm`` / ``register_backend`` do the same)."""
    from flowrl.algorithms import AlgorithmEntry

    monkeypatch.setitem(ALGORITHMS, "toy", AlgorithmEntry(ToyAlgorithm, ToyConfig))
    monkeypatch.setitem(BACKENDS, "toy", ToyFlowModel)


def toy_overrides(tmp_path, prompt_file, *extra):
    return [
        "model.backend=toy",
        "algorithm.name=toy",
        "algorithm.passes=2",
        "rewards={jpeg_compressibility: 1.0}",
        f"data.prompts={prompt_file}",
        "sampler.num_steps=3",
        "training.steps=2",
        "training.prompts_per_step=2",
        "training.group_size=2",
        "training.micro_batch_size=4",
        "evaluation.guidance_scales=[]",
        "evaluation.base_guidance_scales=[]",
        "logging.sample_every=1",
        "logging.progress=false",
        f"logging.output_dir={tmp_path / 'run'}",
        *extra,
    ]


def test_a_new_algorithm_and_backend_train_through_the_unchanged_trainer(tmp_path, toy_registered):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("a red circle\ntwo blue squares\n")
    config = load_config(None, toy_overrides(tmp_path, prompt_file))
    assert isinstance(config.algorithm, ToyConfig) and isinstance(config.model, ToyModelConfig)
    trainer = Trainer(config)
    before = {k: v.clone() for k, v in trainer.policy.copies.unwrapped.state_dict().items()}
    trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2] and rows[-1]["toy/step"] == 2.0
    after = trainer.policy.copies.unwrapped.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    old = trainer.policy.copies.copies[OLD].state_dict()
    assert all(torch.equal(old[k], after[k]) for k in old)  # the algorithm's copy decay 0 = a copy
    assert (tmp_path / "run" / "model" / "toy.safetensors").is_file()


def test_the_new_sections_bring_their_own_keys_and_checks(tmp_path, toy_registered):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("a red circle\n")
    with pytest.raises(ConfigError, match="unknown config key algorithm.beta"):
        load_config(None, toy_overrides(tmp_path, prompt_file, "algorithm.beta=1.0"))
    with pytest.raises(ConfigError, match="unknown config key model.lora_rank"):
        load_config(None, toy_overrides(tmp_path, prompt_file, "model.lora_rank=4"))
    with pytest.raises(ConfigError, match="algorithm.passes=9"):
        load_config(None, toy_overrides(tmp_path, prompt_file, "algorithm.passes=9"))
    with pytest.raises(ConfigError, match="no world to evaluate"):
        load_config(None, toy_overrides(tmp_path, prompt_file, "evaluation.guidance_scales=[1.0]"))


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ConfigError, match=r"algorithm.name='ddpo' is not allowed; allowed: \['nft'"):
        load_config(None, ["algorithm.name=ddpo"])
    with pytest.raises(ConfigError, match=r"model.backend='sdxl' is not allowed; allowed: \['shapes'"):
        load_config(None, ["model.backend=sdxl"])


def test_a_key_of_another_algorithm_is_an_error_and_a_changed_name_starts_the_section_afresh(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key algorithm.clip_range"):
        load_config("configs/shapes_nft.yaml", ["algorithm.clip_range=0.1"])
    # shapes_flowgrpo.yaml extends shapes_nft.yaml but names flow_grpo: none of NFT's keys are inherited
    config = load_config("configs/shapes_flowgrpo.yaml")
    assert config.algorithm.name == "flow_grpo" and not hasattr(config.algorithm, "train_timesteps")


def test_every_registered_backend_declares_the_whole_backend_contract():
    """What the trainer, the policy and evaluation ask of a backend is declared in ``FlowModel`` (the
    protocol), and every registered backend class provides it (``network`` is set per instance)."""
    from flowrl.models import FlowModel

    members = {name for name in vars(FlowModel) if not name.startswith("_")} | set(FlowModel.__annotations__)
    members -= {"network"}
    assert {"is_video", "renders_world", "config_class", "velocity", "decode"} <= members
    for name, backend in BACKENDS.items():
        declared = {key for klass in backend.__mro__ for key in getattr(klass, "__annotations__", {})}
        missing = sorted(
            member for member in members if not hasattr(backend, member) and member not in declared
        )
        assert not missing, f"backend {name!r} lacks {missing}"
