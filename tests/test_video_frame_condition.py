"""The per-frame condition of video models (``frame_condition``): zero to start, added to a trained model,
the frame index reaching the model on noise, pretraining with it, and bad values."""

import pytest
import torch
from video_world_helpers import FRAMES, TINY_SIZES, randomised, tiny_video_config

from flowrl.models import load_shapes_model
from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig
from flowrl.pretrain import PretrainConfig, pretrain
from flowrl.shapes import grammar as image_grammar
from flowrl.video_shapes import grammar

TINY_PRETRAIN = dict(steps=2, batch_size=2, warmup_steps=1, num_frames=FRAMES, frame_patch=1)


def test_with_frame_condition_keeps_every_trained_weight_and_starts_at_zero():
    torch.manual_seed(0)
    video = randomised(ShapesDiT(tiny_video_config(frame_patch=1, video_attention="factorized")))
    conditioned = video.with_frame_condition()
    assert conditioned.config.frame_condition and conditioned.frame_condition.shape == (1, FRAMES, 32)
    state = conditioned.state_dict()
    for name, value in video.state_dict().items():
        assert torch.equal(state[name], value), name
    assert sorted(set(state) - set(video.state_dict())) == ["frame_condition"]
    assert not state["frame_condition"].any()
    with pytest.raises(ValueError, match="needs a video model without one; .*frame_condition=True"):
        conditioned.with_frame_condition()


@pytest.mark.parametrize("frame_patch", [1, 2])
def test_a_per_frame_condition_starts_as_the_model_without_it_and_then_tells_frames_apart(frame_patch):
    """At zero it changes nothing; trained, it makes the output depend on the frame index even on a clip
    whose frames are all the same noise and with no frame embedding."""
    torch.manual_seed(0)
    video = randomised(
        ShapesDiT(tiny_video_config(frame_patch=frame_patch, video_attention="factorized"))
    ).eval()
    conditioned = video.with_frame_condition().eval()
    still = torch.randn(2, 1, 3, 32, 32).expand(2, FRAMES, 3, 32, 32)
    t = torch.tensor([1.0, 0.9])
    ids, mask = video.encode_prompts(["a circle moving left", ""])
    with torch.no_grad():
        torch.testing.assert_close(conditioned(still, t, ids, mask), video(still, t, ids, mask))
        torch.nn.init.normal_(conditioned.frame_condition)
        torch.nn.init.zeros_(conditioned.frame_embedding)
        per_frame = conditioned(still, t, ids, mask)
    assert (per_frame[:, 0] - per_frame[:, -1]).abs().max() > 1e-3
    if frame_patch == 2:  # the two frames of a tubelet share one condition
        assert conditioned.frame_condition.shape[1] == FRAMES // 2


def test_a_factorized_video_model_with_a_frame_condition_starts_as_the_image_model_on_every_frame():
    torch.manual_seed(0)
    image = randomised(ShapesDiT(ShapesDiTConfig(vocabulary=image_grammar.vocabulary(), **TINY_SIZES)))
    video = image.as_video(grammar.vocabulary(), FRAMES, 1, "factorized", frame_condition=True).eval()
    assert video.config.frame_condition and not video.frame_condition.any()
    clip, t, prompts = torch.randn(2, FRAMES, 3, 32, 32), torch.tensor([0.3, 0.8]), ["a red circle", ""]
    with torch.no_grad():
        got = video(clip, t, *video.encode_prompts(prompts))
        expected = torch.stack(
            [image(clip[:, k], t, *image.encode_prompts(prompts)) for k in range(FRAMES)], 1
        )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"frame_condition": "yes"}, "frame_condition='yes' is not allowed for num_frames=4"),
        ({"frame_condition": True, "num_frames": 1}, "frame_condition=True is not allowed for num_frames=1"),
    ],
)
def test_a_bad_frame_condition_is_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        ShapesDiT(tiny_video_config(frame_patch=1, **{"video_attention": "factorized", **changes}))


def test_a_saved_model_with_a_frame_condition_loads_back_the_same(tmp_path):
    model = randomised(
        ShapesDiT(tiny_video_config(frame_patch=1, video_attention="factorized", frame_condition=True))
    )
    model.save_pretrained(tmp_path / "model")
    loaded = load_shapes_model(str(tmp_path / "model"))
    assert loaded.config.frame_condition
    for (name, value), again in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(value, again), name


def test_pretraining_builds_or_adds_a_frame_condition_and_trains_it(tmp_path, tiny_model_dir, one_thread):
    settings = dict(TINY_PRETRAIN, world="video_shapes", video_attention="factorized")
    from_image = pretrain(
        PretrainConfig(**settings, init_from=str(tiny_model_dir), frame_condition=True),
        tmp_path / "from_image",
    )
    assert from_image.config.frame_condition and from_image.frame_condition.abs().sum() > 0
    plain = pretrain(PretrainConfig(**settings, init_from=str(tiny_model_dir)), tmp_path / "plain")
    assert not plain.config.frame_condition and plain.frame_condition is None
    added = pretrain(
        PretrainConfig(**settings, init_from=str(tmp_path / "plain"), frame_condition=True),
        tmp_path / "added",
    )
    assert load_shapes_model(str(tmp_path / "added")).config.frame_condition
    assert added.frame_condition.abs().sum() > 0
