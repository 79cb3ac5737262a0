"""Rewards: callables that turn (media, prompts, metadata) into scores.

Media are float tensors in [0, 1]: images ``[B, 3, H, W]``, videos ``[B, T, 3, H, W]``.
This package never imports ``flowrl``.
"""

from rewards.registry import available_rewards, build_reward, register
from rewards.shapes_verifier import ShapesVerifier

register("shapes_verifier")(ShapesVerifier)

__all__ = ["ShapesVerifier", "available_rewards", "build_reward", "register"]
