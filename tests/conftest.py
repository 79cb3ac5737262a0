"""Shared fixtures: a tiny random-weight shapes model."""

import pytest
import torch

from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig
from flowrl.shapes.grammar import vocabulary


def tiny_config() -> ShapesDiTConfig:
    return ShapesDiTConfig(
        vocabulary=vocabulary(),
        patch_size=4,
        hidden_size=32,
        depth=1,
        num_heads=2,
        text_hidden_size=32,
        text_layers=1,
    )


@pytest.fixture
def tiny_model() -> ShapesDiT:
    torch.manual_seed(0)
    model = ShapesDiT(tiny_config())
    # adaLN-zero starts at v = 0; give every weight a value so outputs depend on inputs.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


@pytest.fixture
def tiny_model_dir(tmp_path, tiny_model):
    """The tiny model saved as a loadable model directory."""
    directory = tmp_path / "tiny_model"
    tiny_model.save_pretrained(directory)
    return directory


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny models sample fastest so, and the machine's cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
