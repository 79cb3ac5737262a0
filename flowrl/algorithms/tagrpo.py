"""TAGRPO (Wang et al., 2026, arXiv 2601.05729): GRPO with direct trajectory alignment, for image-to-video.

Rollouts as Flow-GRPO's (:mod:`flowrl.algorithms.flow_grpo`: the Flow-SDE, its window and trained steps),
with every group's rollouts starting from the same initial noise. Besides each sample's own clipped ratio,
every trained transition of sample ``i`` at step ``j`` is scored against the group's best trajectory ``+``
and worst trajectory ``-`` (the highest and lowest total reward): the new and old policies' densities of
*their* next latent given *its* current latent::

    r_j^{i,±} = p_theta(x_{j+1}^± | x_j^i, c) / p_old(x_{j+1}^± | x_j^i, c)
    J_align   = mean_{i, j} [ min(r^{i,+} A^+, clip(r^{i,+}, 1 - eps, 1 + eps) A^+)
                            + min(r^{i,-} A^-, clip(r^{i,-}, 1 - eps, 1 + eps) A^-) ]
    J         = J_GRPO + gamma J_align                 (the loss is -J; Flow-GRPO's KL term as it is)

With a Gaussian step ``log p(x' | x) = -||x' - mu(x)||² / (2 s²) + const``: raising ``r^{i,+}`` pulls the
step mean from ``x_j^i`` toward the best trajectory's next latent, lowering ``r^{i,-}`` pushes it away from
the worst's; meaningful because the trajectories share their start. ``A^±`` are the anchors' advantages
over the pool the anchors are chosen from, ``(R - mean R_pool) / (std R_pool + 1e-4)`` clipped to
``advantage_clip``: without a memory bank the pool is the group and ``A^±`` are the group-normalised
advantages of its best and worst samples.

The memory bank keeps, per prompt, the best and the worst trajectory of each of its last groups (all their
latents and total rewards; ``memory_bank_size`` trajectories, first in, first out). With it the pool is the
group plus the prompt's bank, so an earlier rollout better (or worse) than any of the group's becomes the
anchor; every rollout of a prompt then starts from the same noise (``prompt_noise``) so that banked
trajectories share the new group's start. A bank is per process (its prompts' groups), checkpointed per
process.

flowrl's reading where the paper's text is not available here (no public code; the loss as described in
the paper's abstract and in notes on its Sec. 3.2, Eqs. 12-19): ``A^±`` as above; one ``eps`` for both terms
(the paper's 0.2); the bank's size, what it stores and how anchors are drawn from it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from flowrl.advantages import group_advantages
from flowrl.algorithms.base import RolloutChunk, TrainBatch, TrainRows, weighted_mean
from flowrl.algorithms.flow_grpo import FlowGRPO, PassTransitions
from flowrl.algorithms.grpo import grpo_clip_loss
from flowrl.algorithms.tagrpo_config import TAGRPOConfig
from samplers import sde_step

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.train_config import TrainConfig

#: a bank entry: all latents of one trajectory ``[S + 1, ...]`` and its total reward
BankEntry = tuple[torch.Tensor, float]


def prompt_seed(prompt: str, seed: int) -> int:
    """A noise seed that depends only on ``prompt`` and the run's ``seed`` (stable across processes and runs)."""
    digest = hashlib.blake2b(f"{seed}\0{prompt}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def pool_anchors(rewards: torch.Tensor, advantage_clip: float) -> tuple[int, int, float, float]:
    """``(best, worst, A+, A-)`` of a pool of total rewards: the first highest and first lowest index and
    their advantages ``(R - mean R) / (std R + 1e-4)`` (population std) clipped to ``advantage_clip``."""
    advantages = group_advantages(rewards, torch.zeros(len(rewards), dtype=torch.long), "group")
    advantages = advantages.clamp(-advantage_clip, advantage_clip)
    best, worst = int(torch.argmax(rewards)), int(torch.argmin(rewards))
    return best, worst, float(advantages[best]), float(advantages[worst])


class TAGRPO(FlowGRPO):
    """TAGRPO: Flow-GRPO plus the alignment of every trained transition with its group's best and worst
    trajectories (module docstring)."""

    metric_keys: ClassVar[dict[str, str]] = {
        **FlowGRPO.metric_keys,
        "tagrpo/align_loss": "-J_align: the clipped surrogates toward the best and away from the worst trajectory",
        "tagrpo/ratio_best": "p_theta / p_old of the best trajectory's next latent from each sample's current one",
        "tagrpo/ratio_worst": "p_theta / p_old of the worst trajectory's next latent from each sample's current one",
        "tagrpo/bank_anchor_share": "share of groups whose best or worst anchor came from the memory bank",
    }
    #: each process keeps its own memory bank (its prompts' groups); checkpoints hold one per process
    state_per_process = True

    config: TAGRPOConfig

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.group_size = config.training.group_size
        #: ``prompt -> [(latents [S + 1, ...], total reward), ...]``, oldest first
        self.bank: dict[str, list[BankEntry]] = {}
        self._prompts: list[str] = []

    def noise_seeds(self, records: list[dict], seeds: list[int]) -> list[int]:
        """With ``prompt_noise`` every sample of a prompt starts from the prompt's own noise."""
        if not self.config.prompt_noise:
            return seeds
        return [prompt_seed(record["prompt"], self.train_config.training.seed) for record in records]

    def before_rollout(self, policy: Policy, records: list[dict], seeds: list[int], step: int) -> None:
        self._prompts = [record["prompt"] for record in records]

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        """Flow-GRPO's rows plus, per row, its group's anchor trajectories ``[2, S + 1, ...]`` (best, worst)
        and their advantages ``[2]``; then the groups' best and worst trajectories enter the bank."""
        rows = super().training_rows(chunks, advantages, rewards, step)
        latents, rewards = rows.data["latents"], rewards.float().cpu()
        anchors, anchor_advantages, from_bank = [], [], 0
        for start in range(0, latents.shape[0], self.group_size):
            group = slice(start, start + self.group_size)
            banked = self.bank.get(self._prompts[start], [])
            pool = [*latents[group], *(entry[0].to(latents.device) for entry in banked)]
            pool_rewards = torch.cat([rewards[group], torch.tensor([entry[1] for entry in banked])])
            best, worst, plus, minus = pool_anchors(pool_rewards, self.config.advantage_clip)
            from_bank += int(max(best, worst) >= self.group_size)
            pair = torch.stack([pool[best], pool[worst]])
            anchors.append(pair.unsqueeze(0).expand(self.group_size, *pair.shape))
            anchor_advantages.append(torch.tensor([[plus, minus]]).expand(self.group_size, 2))
            self._bank_group(self._prompts[start], latents[group], rewards[group])
        rows.data["anchor_latents"] = torch.cat(anchors)
        rows.data["anchor_advantages"] = torch.cat(anchor_advantages).to(latents.device)
        groups = latents.shape[0] // self.group_size
        rows.log["tagrpo/bank_anchor_share"] = from_bank / groups if groups else 0.0
        return rows

    def _bank_group(self, prompt: str, latents: torch.Tensor, rewards: torch.Tensor) -> None:
        """The group's best and worst trajectories enter the prompt's bank (first in, first out)."""
        if not self.config.memory_bank_size:
            return
        entries = self.bank.setdefault(prompt, [])
        for index in (int(torch.argmax(rewards)), int(torch.argmin(rewards))):
            entries.append((latents[index].detach().cpu().clone(), float(rewards[index])))
        del entries[: max(0, len(entries) - self.config.memory_bank_size)]

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        p = self.pass_transitions(batch, pass_index)
        v = self._velocity(policy.velocity, policy, batch.cond)(p.x, p.t, batch.cond)
        loss, stats = self.transition_loss(
            policy, batch, p.x, p.x_next, p.t, p.t_next, p.noise_level, p.old_log_prob, velocity=lambda *_: v
        )
        align, align_stats = self.alignment(policy, batch, p, v)
        loss = loss + self.config.align_weight * weighted_mean(align, batch.weights)
        return self.with_ode_anchor(policy, batch, pass_index, loss, {**stats, **align_stats})

    def alignment(
        self, policy: Policy, batch: TrainBatch, p: PassTransitions, v: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per row ``-J_align`` of the pass's transitions (module docstring): the anchors' next latents
        scored from each row's current latent by the trained velocity ``v`` and by the old policy's."""
        if self.train_config.training.updates_per_step == 1:  # every pass precedes the step's one update:
            v_old = v.detach()  # theta is still the old (rollout) copy, bit for bit (tested)
        else:
            with torch.no_grad():
                v_old = self._velocity(policy.old_velocity, policy, batch.cond)(p.x, p.t, batch.cond)
        anchors = batch.data["anchor_latents"]
        advantages = batch.data["anchor_advantages"]
        variant = self.config.sde_variant
        terms, ratios = [], []
        for which in (0, 1):  # the best, then the worst trajectory
            target = anchors[p.rows, which, p.index + 1]
            new = sde_step(v, p.x, p.t, p.t_next, p.noise_level, variant, x_next=target).log_prob
            old = sde_step(v_old, p.x, p.t, p.t_next, p.noise_level, variant, x_next=target).log_prob
            term, ratio = grpo_clip_loss(new, old, advantages[:, which], self.config.clip_range)
            terms.append(term)
            ratios.append(ratio.detach())
        align = terms[0] + terms[1]
        return align, {
            "tagrpo/align_loss": align.detach(),
            "tagrpo/ratio_best": ratios[0],
            "tagrpo/ratio_worst": ratios[1],
        }

    def state_dict(self) -> dict[str, Any]:
        """The memory bank: per prompt its trajectories ``[n, S + 1, ...]`` and rewards ``[n]``."""
        if not self.bank:
            return {}
        prompts = sorted(self.bank)
        return {
            "prompts": prompts,
            "latents": [torch.stack([entry[0] for entry in self.bank[prompt]]) for prompt in prompts],
            "rewards": [torch.tensor([entry[1] for entry in self.bank[prompt]]) for prompt in prompts],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bank = {
            prompt: [(trajectory, float(reward)) for trajectory, reward in zip(latents, rewards)]
            for prompt, latents, rewards in zip(
                state.get("prompts", []), state.get("latents", []), state.get("rewards", [])
            )
        }
