"""Image-to-video: the first-frame world (records, their conditioning frame, ground truth the verifier
passes), a video model made image-conditioned (the same function at first; the frame reaches the output),
the backend's contract (frames only for such a model, no CFG), pretraining one, and the trainer end to end
with Flow-GRPO and TAGRPO (evaluation on the continued-clip world)."""

import json

import numpy as np
import pytest
import torch
from test_video_training import VIDEO_RUN
from video_world_helpers import FRAMES, randomised, tiny_video_model

from flowrl.config import ConfigError, load_config
from flowrl.generate import generate
from flowrl.models import ShapesFlowModel, load_shapes_model
from flowrl.models.shapes_dit import ShapesDiT
from flowrl.policy import Policy
from flowrl.pretrain import pretrain
from flowrl.pretrain_config import PretrainConfig
from flowrl.run_log import read_metrics
from flowrl.trainer import train
from flowrl.video_shapes.first_frame import SEED_KEY, continued_clip, first_frames, layout_seed
from flowrl.worlds import WORLDS, world_of_model
from rewards.video_shapes_verifier import VideoShapesVerifier

I2V = WORLDS["video_shapes_i2v"]


def test_every_record_carries_a_fixed_layout_whose_frame_zero_conditions_the_clip():
    train, test = I2V.prompts("train"), I2V.prompts("test")
    assert len(train) == len(WORLDS["video_shapes"].prompts("train")) and all(SEED_KEY in r for r in train)
    assert train[0][SEED_KEY] == layout_seed(train[0]["prompt"], "train") == I2V.prompts("train")[0][SEED_KEY]
    assert layout_seed(train[0]["prompt"], "test") != train[0][SEED_KEY]
    clip = continued_clip(test[0], FRAMES)
    np.testing.assert_array_equal(clip, I2V.render(test[0], np.random.default_rng(99), (FRAMES, 3, 32, 32)))
    frames = first_frames(test[:3], (FRAMES, 3, 32, 32))
    assert frames.shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(frames[0].movedim(0, -1).numpy(), clip[0])
    with pytest.raises(ValueError, match="has no first_frame_seed"):
        continued_clip({"prompt": "a circle moving left", "include": []})


def test_the_verifier_passes_the_worlds_own_continuations():
    records = I2V.prompts("test")
    clips = torch.from_numpy(np.stack([continued_clip(r) for r in records])).movedim(-1, -3)
    scores = VideoShapesVerifier()(clips, [r["prompt"] for r in records], records)
    assert float(scores["strict"].mean()) == 1.0


def test_an_image_conditioned_copy_starts_as_the_video_model_and_then_reads_the_frame():
    video = tiny_video_model()
    continued = video.with_image_condition().eval()
    assert continued.config.image_condition and torch.count_nonzero(continued.image_embed.weight) == 0
    x, t = torch.randn(2, *video.sample_shape), torch.tensor([0.9, 0.4])
    ids, mask = video.encode_prompts(["a circle moving left", "a square moving up"])
    frames = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(continued(x, t, ids, mask, image=frames), video(x, t, ids, mask))
        randomised(continued, seed=3)
        first, second = continued(x, t, ids, mask, image=frames), continued(x, t, ids, mask, image=1 - frames)
    assert float((first - second).abs().max()) > 1e-3
    with pytest.raises(ValueError, match="needs a first frame of shape"):
        continued(x, t, ids, mask)
    with pytest.raises(ValueError, match="no image_condition"):
        video(x, t, ids, mask, image=frames)
    with pytest.raises(ValueError, match="needs a video model without one"):
        continued.with_image_condition()


def test_the_backend_takes_frames_only_for_an_image_to_video_model_and_refuses_cfg(tmp_path):
    video = tiny_video_model()
    plain = Policy.for_inference(ShapesFlowModel(video))
    with pytest.raises(ValueError, match="not an image-to-video model"):
        plain.encode(["a circle moving left"], torch.rand(1, 3, 32, 32))
    continued = Policy.for_inference(ShapesFlowModel(video.with_image_condition()))
    with pytest.raises(ValueError, match="needs a first frame per prompt"):
        continued.encode(["a circle moving left"])
    ids, mask, frames = continued.encode(["a circle moving left"], torch.ones(1, 3, 32, 32))
    assert torch.equal(frames, torch.ones(1, 3, 32, 32))  # [0, 1] -> model space [-1, 1]
    with pytest.raises(ValueError, match="needs the prompt record"):
        generate(continued, ["a circle moving left"], [0], num_steps=1)
    video.with_image_condition().save_pretrained(tmp_path / "i2v")
    assert world_of_model(True, True) is I2V
    with pytest.raises(ConfigError, match="it samples without CFG"):
        load_config(
            "configs/video_shapes_i2v_flowgrpo.yaml",
            [f"model.name={tmp_path / 'i2v'}", "sampler.guidance_scale=3.0"],
        )


def test_pretraining_on_the_continued_world_makes_an_image_to_video_model(tmp_path, one_thread):
    base = tiny_video_model(frame_patch=1)
    base.save_pretrained(tmp_path / "video")
    config = PretrainConfig(
        steps=2,
        batch_size=2,
        world="video_shapes_i2v",
        init_from=str(tmp_path / "video"),
        num_frames=FRAMES,
        hidden_size=32,
        depth=1,
        num_heads=2,
        text_hidden_size=32,
        text_layers=1,
        mixed_precision="no",
    )
    pretrain(config, tmp_path / "i2v")
    model = ShapesDiT.from_pretrained(tmp_path / "i2v")
    assert model.config.image_condition and torch.count_nonzero(model.image_embed.weight) > 0
    with pytest.raises(ValueError, match="is an image-to-video model"):
        pretrain(
            PretrainConfig(
                **{**config.__dict__, "world": "video_shapes", "init_from": str(tmp_path / "i2v")}
            ),
            tmp_path / "x",
        )


@pytest.mark.parametrize("recipe", ["video_shapes_i2v_flowgrpo", "video_shapes_i2v_tagrpo"])
def test_the_trainer_continues_first_frames_and_evaluates_on_the_continued_world(
    tmp_path, one_thread, recipe
):
    tiny_video_model().with_image_condition().save_pretrained(tmp_path / "i2v")
    randomised(load_shapes_model(str(tmp_path / "i2v"))).save_pretrained(tmp_path / "i2v")
    grpo = [override for override in VIDEO_RUN if not override.startswith("algorithm.")]
    config = load_config(
        f"configs/{recipe}.yaml",
        [
            *grpo,
            "training.group_size=2",
            "training.micro_batch_size=4",
            "training.steps=2",
            "sampler.num_steps=3",
            "algorithm.sde_window_size=2",
            f"model.name={tmp_path / 'i2v'}",
            f"logging.output_dir={tmp_path / 'run'}",
        ],
    )
    assert config.evaluation_world == "video_shapes_i2v"
    summary = train(config)
    assert 0.0 <= summary["tuned"]["1"]["i2veval/overall"] <= 1.0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2] and "eval/i2veval/overall" in rows[-1]
    evaluation = json.loads((tmp_path / "run" / "eval" / "tuned_cfg1.json").read_text())
    assert "i2veval/motion" in evaluation


def test_the_shipped_image_to_video_base_continues_its_first_frame(one_thread):
    """shapes-video-i2v (its model card): on held-out single-object prompts its clips start from the given
    frame and pass the verifier (direction, speed, colour) most of the time."""
    model = load_shapes_model("shapes-video-i2v")
    records = [record for record in I2V.prompts("test") if record["tag"] in ("motion", "color_motion")][:8]
    clips = generate(model, [r["prompt"] for r in records], list(range(8)), num_steps=10, records=records)
    given = first_frames(records, model.sample_shape)
    assert float((clips[:, 0] - given).abs().mean()) < 0.01  # 0.004 (text-to-video v2 on the same: 0.039)
    scores = VideoShapesVerifier()(clips, [r["prompt"] for r in records], records)
    assert float(scores["strict"].mean()) >= 0.75


def test_flowrl_sample_continues_a_shipped_prompts_first_frame(tmp_path, one_thread, capsys):
    from flowrl.cli import main

    out = tmp_path / "clips.gif"
    assert (
        main(
            [
                "sample",
                "--model",
                "shapes-video-i2v",
                "--prompt",
                "a red circle moving left",
                "--seeds",
                "0",
                "--steps",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert out.is_file()
    assert main(["sample", "--model", "shapes-video-i2v", "--prompt", "a red blob", "--out", str(out)]) == 2
    assert "is not allowed for an image-to-video model" in capsys.readouterr().err


def test_an_image_to_video_model_refuses_prompts_without_first_frames(tmp_path):
    tiny_video_model().with_image_condition().save_pretrained(tmp_path / "i2v")
    with pytest.raises(ConfigError, match="its prompts must carry first frames"):
        load_config(
            "configs/video_shapes_flowgrpo.yaml",
            [f"model.name={tmp_path / 'i2v'}", "evaluation.base_guidance_scales=[1.0]"],
        )
