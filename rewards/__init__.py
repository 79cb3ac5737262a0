"""Rewards: callables that turn (media, prompts, metadata) into scores.

Media are float tensors in [0, 1]: images ``[B, 3, H, W]``, videos ``[B, T, 3, H, W]``.
Built-ins with heavy backbones are registered lazily and import on first use.
This package never imports ``flowrl``.
"""

from rewards.async_scoring import AsyncScorer
from rewards.base import RewardError, checked_scores, score
from rewards.brightness import brightness
from rewards.exemplar_fd import ExemplarFD
from rewards.jpeg import jpeg_compressibility, jpeg_incompressibility
from rewards.multi import MultiReward, SkippedBatch
from rewards.registry import (
    available_rewards,
    build_reward,
    describe_rewards,
    outside_settings,
    register,
    register_lazy,
    resolve_reward,
)
from rewards.shapes_verifier import ShapesVerifier
from rewards.video_shapes_verifier import VideoShapesVerifier
from rewards.weights import MissingWeightsError

register("shapes_verifier")(ShapesVerifier)
register("video_shapes_verifier")(VideoShapesVerifier)
register("exemplar_fd")(ExemplarFD)
for _name, _path in {
    "clip_score": "rewards.clip_score:CLIPScore",
    "pickscore": "rewards.pickscore:PickScore",
    "hpsv2": "rewards.hps:HPSv2",
    "aesthetic": "rewards.aesthetic:LaionAesthetic",
    "ocr": "rewards.ocr:OCRReward",
    "frame_average": "rewards.video:FrameAveraged",
    "temporal_consistency": "rewards.video:TemporalConsistency",
    "remote": "rewards.remote:RemoteReward",
}.items():
    register_lazy(_name, _path)

__all__ = [
    "AsyncScorer",
    "ExemplarFD",
    "MissingWeightsError",
    "MultiReward",
    "RewardError",
    "ShapesVerifier",
    "SkippedBatch",
    "VideoShapesVerifier",
    "available_rewards",
    "brightness",
    "build_reward",
    "checked_scores",
    "describe_rewards",
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "outside_settings",
    "register",
    "register_lazy",
    "resolve_reward",
    "score",
]
