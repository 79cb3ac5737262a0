"""The reward layer: registry and plugins, boundary checks, multi-reward aggregation, built-ins, async scoring.

Longer than 400 lines on purpose: the reward layer's registry, boundary checks and every built-in's tiny
architecture test share their fixtures.
"""

import inspect
import sys
import textwrap
import threading

import numpy as np
import open_clip
import pytest
import torch

import rewards
from rewards import (
    AsyncScorer,
    MissingWeightsError,
    MultiReward,
    RewardError,
    build_reward,
    describe_rewards,
    register,
    score,
)
from rewards.aesthetic import LaionAesthetic
from rewards.jpeg import jpeg_kilobytes
from rewards.ocr import target_text
from rewards.testing import (
    TINY_CLIP,
    offline_clip_tokenizer,
    tiny_aesthetic_head,
    tiny_open_clip_checkpoint,
    tiny_pickscore_model,
)


def images(batch=4, size=32, seed=0):
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


PROMPTS = ["a red circle", "two squares", "a blue triangle", "a photo of a cat"]
META = [{}] * 4


# --- registry and plugins -------------------------------------------------------------------------


@register("test_brightness")
def brightness(media, prompts, metadata):
    return media.mean(dim=(1, 2, 3))


@register("test_scaled_brightness")
class ScaledBrightness:
    modality = "image"

    def __init__(self, scale=1.0):
        self.scale = scale

    def __call__(self, media, prompts, metadata):
        return {"light": self.scale * media.mean(dim=(1, 2, 3)), "dark": 1 - media.mean(dim=(1, 2, 3))}


def test_registered_functions_and_classes_build():
    batch = images()
    assert torch.equal(build_reward("test_brightness")(batch, PROMPTS, META), batch.mean(dim=(1, 2, 3)))
    scaled = build_reward("test_scaled_brightness", scale=2.0)(batch, PROMPTS, META)
    torch.testing.assert_close(scaled["light"], 2 * batch.mean(dim=(1, 2, 3)))
    with pytest.raises(ValueError, match="takes no settings"):
        build_reward("test_brightness", scale=2.0)
    with pytest.raises(ValueError, match="already registered"):
        register("test_brightness")(lambda m, p, d: m)
    with pytest.raises(ValueError, match=r"unknown reward 'nope'.*shapes_verifier"):
        build_reward("nope")


def test_dotted_path_names_a_reward():
    reward = build_reward("rewards.video:TemporalConsistency", encoder="pixels")
    assert reward.encoder == "pixels" and reward.modality == "video"
    assert build_reward("rewards.jpeg:jpeg_kilobytes") is jpeg_kilobytes
    with pytest.raises(ValueError, match="cannot import"):
        build_reward("rewards.jpeg:Missing")


def test_entry_point_plugin_is_discovered_by_name(tmp_path, monkeypatch):
    """A real installed-package layout: a module plus a .dist-info with entry_points.txt on sys.path."""
    (tmp_path / "my_reward_plugin.py").write_text(
        textwrap.dedent("""
        import torch

        class Redness:
            modality = "image"

            def __call__(self, media, prompts, metadata):
                return media[:, 0].mean(dim=(1, 2))
    """)
    )
    info = tmp_path / "my_reward_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-reward-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[flowrl.rewards]\nredness = my_reward_plugin:Redness\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "redness" in rewards.available_rewards()
        batch = images()
        torch.testing.assert_close(
            build_reward("redness")(batch, PROMPTS, META), batch[:, 0].mean(dim=(1, 2))
        )
        row = next(row for row in describe_rewards() if row.name == "redness")
        assert (row.modality, row.source) == ("image", "registered")  # loaded, so now registered
    finally:
        rewards.registry._REGISTRY.pop("redness", None)
        sys.modules.pop("my_reward_plugin", None)


def test_listing_shows_modality_and_weights():
    rows = {row.name: row for row in describe_rewards()}
    assert rows["shapes_verifier"].weights == "not needed"
    assert rows["temporal_consistency"].modality == "video"
    assert rows["hpsv2"].weights.startswith(("missing: xswu/HPSv2", "present"))


# --- boundary checks -----------------------------------------------------------------------------


def test_media_of_the_wrong_modality_is_refused_before_the_reward_runs():
    def never(media, prompts, metadata):
        raise AssertionError("the reward must not see bad media")

    videos = images(8).view(2, 4, 3, 32, 32)
    with pytest.raises(RewardError, match=r"expects media \[B, 3, H, W\], got shape \(2, 4, 3, 32, 32\)"):
        score("never", never, videos, PROMPTS[:2], META[:2])
    never.modality = "video"
    with pytest.raises(RewardError, match=r"expects media \[B, T, 3, H, W\], got shape \(4, 3, 32, 32\)"):
        score("never", never, images(), PROMPTS, META)


def test_nan_wrong_shape_and_exceptions_are_clear_errors():
    batch = images()

    def with_nan(media, prompts, metadata):
        values = media.mean(dim=(1, 2, 3))
        values[[1, 3]] = float("nan")
        return values

    with pytest.raises(RewardError, match=r"'with_nan'.*indices \[1, 3\]"):
        score("with_nan", with_nan, batch, PROMPTS, META)
    with pytest.raises(RewardError, match=r"'flat'.*shape \(4, 1\)"):
        score("flat", lambda m, p, d: m.mean(dim=(1, 2, 3))[:, None], batch, PROMPTS, META)
    with pytest.raises(RewardError, match=r"'scaled/dark'.*indices \[0\]"):
        score(
            "scaled",
            lambda m, p, d: {"ok": torch.ones(4), "dark": torch.tensor([float("inf"), 0, 0, 0])},
            batch,
            PROMPTS,
            META,
        )

    def broken(media, prompts, metadata):
        raise KeyError("boom")

    with pytest.raises(RewardError, match="'broken' raised KeyError"):
        score("broken", broken, batch, PROMPTS, META)
    with pytest.raises(RewardError, match=r"expects media \[B, 3, H, W\]"):
        score("test_brightness", brightness, batch[:, :2], PROMPTS, META)


def test_checked_scores_are_cpu_float32_and_unchanged():
    values = torch.tensor([0.5, -1.0, 3.0, 2.0], dtype=torch.float64)
    checked = score("exact", lambda m, p, d: values, images(), PROMPTS, META)
    assert checked["exact"].dtype == torch.float32 and checked["exact"].tolist() == [0.5, -1.0, 3.0, 2.0]


# --- MultiReward --------------------------------------------------------------------


def test_multireward_scores_weights_and_aggregates():
    multi = MultiReward(
        {
            "test_brightness": 2.0,
            "scaled": {
                "reward": "test_scaled_brightness",
                "weight": 0.5,
                "key": "dark",
                "settings": {"scale": 3.0},
            },
        }
    )
    batch = images()
    scores = multi(batch, PROMPTS, META)
    assert set(scores) == {"test_brightness", "scaled/light", "scaled/dark"}
    mean = batch.mean(dim=(1, 2, 3))
    torch.testing.assert_close(multi.total(scores), 2.0 * mean + 0.5 * (1 - mean))
    assert multi.weights == {"test_brightness": 2.0, "scaled": 0.5}
    assert set(multi.components(scores)) == {"test_brightness", "scaled"}


def test_ocr_target_text_survives_apostrophes():
    assert target_text("a mug reading 'Don't panic'", {}) == "Don't panic"
    assert target_text("Joe's cafe sign with 'HELLO' on it", {}) == "HELLO"
    assert target_text('a sign that says "OPEN"', {}) == "OPEN"
    assert target_text("a card saying “hi there”", {}) == "hi there"
    assert target_text("no quotes here", {"text": "META"}) == "META"
    with pytest.raises(ValueError, match="no target text"):
        target_text("Joe's cafe", {})


def test_aesthetic_default_architecture_uses_openai_quickgelu():
    default = inspect.signature(LaionAesthetic).parameters["model_name"].default
    assert open_clip.get_model_config(default)["quick_gelu"] is True


def test_multireward_rejects_bad_settings():
    with pytest.raises(ValueError, match="unknown fields"):
        MultiReward({"test_brightness": {"wieght": 1.0}})
    multi = MultiReward({"test_scaled_brightness": 1.0})
    with pytest.raises(ValueError, match="set its 'key'"):
        multi.total(multi(images(), PROMPTS, META))
    with pytest.raises(ValueError, match="share a modality"):
        MultiReward({"test_brightness": 1.0, "temporal_consistency": 1.0})


def test_shapes_verifier_aggregates_its_partial_score():
    from flowrl.shapes.grammar import task_prompts
    from flowrl.shapes.render import render_prompt

    records = task_prompts("colors")[:4]
    rng = np.random.default_rng(0)
    batch = torch.from_numpy(np.stack([render_prompt(r, rng) for r in records])).permute(0, 3, 1, 2)
    multi = MultiReward({"shapes_verifier": 1.0})
    scores = multi(batch, [r["prompt"] for r in records], records)
    assert multi.total(scores).tolist() == [1.0] * 4


# --- built-in rewards on tiny architectures ------------------------------------------------------------


def test_jpeg_rewards_prefer_simple_or_detailed_images():
    flat = torch.full((1, 3, 64, 64), 0.5)
    noisy = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    batch = torch.cat([flat, noisy])
    compressibility = build_reward("jpeg_compressibility")(batch, PROMPTS[:2], META[:2])
    assert compressibility[0] > compressibility[1]
    torch.testing.assert_close(
        build_reward("jpeg_incompressibility")(batch, PROMPTS[:2], META[:2]), -compressibility
    )
    assert jpeg_kilobytes(noisy) > 5 * jpeg_kilobytes(flat)


def test_clip_score_on_a_tiny_clip(tmp_path):
    reward = build_reward(
        "clip_score", model_name=TINY_CLIP, checkpoint=tiny_open_clip_checkpoint(tmp_path / "clip.pt")
    )
    batch = images()
    scores = score("clip_score", reward, batch, PROMPTS, META)["clip_score"]
    assert scores.shape == (4,) and (scores >= 0).all() and (scores <= 2.5).all()
    again = reward(batch, PROMPTS, META)
    assert torch.equal(scores, again)
    swapped = reward(batch, PROMPTS[::-1], META)
    assert not torch.allclose(scores, swapped)


def test_an_offloaded_reward_scores_the_same_and_rests_on_the_cpu(tmp_path, monkeypatch):
    checkpoint = tiny_open_clip_checkpoint(tmp_path / "clip.pt")
    spec = {"reward": "clip_score", "settings": {"model_name": TINY_CLIP, "checkpoint": str(checkpoint)}}
    kept = MultiReward({"clip": spec})
    offloaded = MultiReward({"clip": {**spec, "offload": True}})
    network = offloaded.entries[0].reward.model
    devices = []
    # "cpu:0" stands in for an accelerator: a device distinct in name from the resting "cpu"
    monkeypatch.setattr(offloaded.entries[0].reward, "device", torch.device("cpu", 0))
    original_to = network.to
    monkeypatch.setattr(network, "to", lambda device: devices.append(str(device)) or original_to(device))
    batch = images()
    assert torch.equal(offloaded(batch, PROMPTS, META)["clip"], kept(batch, PROMPTS, META)["clip"])
    assert devices == ["cpu:0", "cpu"]  # moved to its device for the call, back to the CPU after
    with pytest.raises(ValueError, match="'jpeg' cannot be offloaded"):
        MultiReward({"jpeg": {"reward": "jpeg_compressibility", "offload": True}})
    with pytest.raises(ValueError, match="offload 'yes'"):
        MultiReward.check_spec({"clip": {**spec, "offload": "yes"}})


def test_hps_loads_a_state_dict_checkpoint(tmp_path):
    checkpoint = tiny_open_clip_checkpoint(tmp_path / "HPS_v2.1_compressed.pt", wrap_state_dict=True)
    reward = build_reward("hpsv2", model_name=TINY_CLIP, checkpoint=checkpoint)
    scores = score("hpsv2", reward, images(), PROMPTS, META)["hpsv2"]
    assert scores.shape == (4,) and (scores.abs() <= 1).all()
    with pytest.raises(ValueError, match="unknown HPS version"):
        build_reward("hpsv2", version="v3", checkpoint=checkpoint)


def test_aesthetic_on_tiny_clip_and_head(tmp_path):
    reward = build_reward(
        "aesthetic",
        model_name=TINY_CLIP,
        clip_checkpoint=tiny_open_clip_checkpoint(tmp_path / "clip.pt"),
        head_checkpoint=tiny_aesthetic_head(tmp_path / "head.pth"),
    )
    batch = images()
    scores = score("aesthetic", reward, batch, PROMPTS, META)["aesthetic"]
    assert scores.shape == (4,) and torch.equal(scores, reward(batch, ["x"] * 4, META))  # prompt-free


def test_pickscore_on_a_tiny_transformers_clip(tmp_path):
    reward = build_reward(
        "pickscore",
        model_path=tiny_pickscore_model(tmp_path / "model"),
        tokenizer_path=offline_clip_tokenizer(tmp_path / "tokenizer"),
    )
    batch = images()
    scores = score("pickscore", reward, batch, PROMPTS, META)["pickscore"]
    scale = reward.model.logit_scale.exp().item()
    assert scores.shape == (4,) and (scores.abs() <= scale + 1e-4).all()
    assert not torch.allclose(scores, reward(batch, PROMPTS[::-1], META))


def test_missing_weights_say_what_to_download(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(
        MissingWeightsError, match=r"HPS_v2.1_compressed.pt.*xswu/HPSv2.*huggingface-cli download"
    ):
        build_reward("hpsv2")
    with pytest.raises(MissingWeightsError, match="laion/CLIP-ViT-H-14-laion2B-s32B-b79K"):
        build_reward("clip_score")
    with pytest.raises(MissingWeightsError, match="yuvalkirstain/PickScore_v1"):
        build_reward("pickscore")
    with pytest.raises(MissingWeightsError, match="trl-lib/ddpo-aesthetic-predictor|timm/vit_large"):
        build_reward("aesthetic")
    with pytest.raises(MissingWeightsError, match="does not exist"):
        build_reward("clip_score", checkpoint=tmp_path / "nothing.pt")


def test_ocr_reads_rendered_text():
    pytest.importorskip("rapidocr_onnxruntime")
    from PIL import Image, ImageDraw, ImageFont

    canvas = Image.new("RGB", (320, 96), "white")
    ImageDraw.Draw(canvas).text((16, 20), "HELLO 42", fill="black", font=ImageFont.load_default(size=48))
    batch = (
        torch.from_numpy(np.asarray(canvas, dtype=np.float32) / 255).permute(2, 0, 1)[None].repeat(2, 1, 1, 1)
    )
    reward = build_reward("ocr")
    scores = score(
        "ocr", reward, batch, ['a sign that says "hello 42"', "a poster"], [{}, {"text": "goodbye"}]
    )["ocr"]
    assert scores[0] >= 0.85 and scores[1] <= 0.3
    with pytest.raises(RewardError, match="no target text"):
        score("ocr", reward, batch[:1], ["no quotes here"], [{}])


# --- video rewards ----------------------------------------------------------------------------------------


def test_frame_average_is_the_mean_over_sampled_frames():
    videos = torch.rand(2, 6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    reward = build_reward("frame_average", reward="jpeg_incompressibility", num_frames=3)
    scores = score("frame_average", reward, videos, PROMPTS[:2], META[:2])["frame_average"]
    frames = videos[:, [0, 2, 5]]  # linspace(0, 5, 3) rounded
    expected = jpeg_kilobytes(frames.flatten(0, 1)).view(2, 3).mean(dim=1)
    torch.testing.assert_close(scores, expected)


def test_temporal_consistency_prefers_steady_clips(tmp_path):
    still = torch.rand(1, 1, 3, 32, 32).repeat(1, 5, 1, 1, 1)
    flicker = torch.rand(1, 5, 3, 32, 32)
    clips = torch.cat([still, flicker])
    pixels = score("temporal_consistency", build_reward("temporal_consistency"), clips, PROMPTS[:2], META[:2])
    assert pixels["temporal_consistency"][0] == 1.0 and pixels["temporal_consistency"][1] < 0.8
    clip = build_reward(
        "temporal_consistency",
        encoder="clip",
        model_name=TINY_CLIP,
        checkpoint=tiny_open_clip_checkpoint(tmp_path / "clip.pt"),
    )
    features = clip(clips, PROMPTS[:2], META[:2])
    assert features[0] == pytest.approx(1.0, abs=1e-5) and features[1] < features[0]


# --- async scoring -----------------------------------------------------------------------------------------


def test_async_scoring_overlaps_and_returns_the_same_scores():
    started, release = threading.Event(), threading.Event()

    def gated(media, prompts, metadata):
        started.set()
        assert release.wait(timeout=10), "the caller never released the reward"
        return media.mean(dim=(1, 2, 3))

    batch = images()
    with AsyncScorer(gated) as scorer:
        future = scorer.submit(batch, PROMPTS, META)
        # submit() returned while the reward is still running: the caller works meanwhile.
        assert started.wait(timeout=10) and not future.done()
        release.set()
        assert torch.equal(future.result(timeout=10), batch.mean(dim=(1, 2, 3)))

    def failing(media, prompts, metadata):
        raise ValueError("bad batch")

    with AsyncScorer(lambda m, p, d: score("failing", failing, m, p, d)) as scorer:
        with pytest.raises(RewardError, match="failing"):
            scorer.submit(batch, PROMPTS, META).result(timeout=5)
    assert threading.active_count() >= 1


def test_an_entry_named_like_its_sub_score_is_found():
    # Scores of entry "dark" with sub-scores light/dark are labelled "dark/light" and "dark".
    multi = MultiReward({"dark": {"reward": "test_scaled_brightness", "key": "dark"}})
    batch = images()
    scores = multi(batch, PROMPTS, META)
    assert set(scores) == {"dark", "dark/light"}
    torch.testing.assert_close(multi.total(scores), 1 - batch.mean(dim=(1, 2, 3)))
