"""The contract between the trainer and an algorithm, written once.

The trainer owns the loop (prompts, rollouts through the policy, rewards,
optimizer, checkpoints); an algorithm owns what rollout it needs, how rewards
become advantages, how the scored rollout becomes training rows, how a batch
of rows becomes a loss, and which weight copies move after each update.
Every algorithm subclasses :class:`Algorithm` (defaults for the optional
hooks) and has a config dataclass subclassing :class:`AlgorithmConfig`; the
two are registered under one name in :mod:`flowrl.algorithms`.

One step, as the trainer calls the hooks::

    before_rollout(...)     with the process's prompt records and seeds (optional: off-policy data,
                            which weights sample)
    rollout(...)            per micro-batch of whole groups, with the rollout velocity
    advantages(rewards)     once, on the rewards gathered from every process
    training_rows(...)      the process's rows (samples, or tree edges)
    draw(...)               the step's random draws for the global batch
    loss(...)               per (pass, micro-batch of rows); gradients accumulate
    after_optimizer_step()  which copies move (old, rollout) and what to log

An algorithm that keeps state of its own across steps (SePPO's pool of earlier checkpoints) returns it
from ``state_dict``; the trainer saves it in every checkpoint (``algorithm.pt``) and gives it back to
``load_state_dict`` on resume, so a resumed run continues exactly; one whose state differs between processes
(TAGRPO's memory banks) sets ``state_per_process`` and every process's is kept.

Rows: forward-process algorithms train on samples (one row per image);
Flow-GRPO on samples too (a pass per trained SDE step); BranchGRPO on tree
edges. The loop only sees rows: it splits them into micro-batches, runs
``loss`` on each for every pass, and weights each micro-batch by its share of
the rows of its optimizer update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accelerate.utils import gather_object

from flowrl.advantages import RewardBatch, reward_advantages
from flowrl.config_schema import ConfigError
from flowrl.train_config import TrainConfig
from samplers import VelocityFn

if TYPE_CHECKING:
    from flowrl.policy import Policy


@dataclass
class RolloutChunk:
    """One rollout micro-batch: the final samples ``x0`` ``[n, ...]`` (one per image, in the order of
    the step's sample list) to score, and whatever the algorithm keeps for training (``data``)."""

    x0: torch.Tensor
    data: Any = None


@dataclass
class TrainRows:
    """A process's training rows for one step: per-row tensors (``data``, first dimension = rows),
    the conditioning row of each (``cond_index``, into the process's samples) and its advantage."""

    data: dict[str, torch.Tensor]
    cond_index: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor | None = None
    log: dict[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return int(self.cond_index.shape[0])


@dataclass
class TrainBatch:
    """A micro-batch of training rows as the algorithm's loss sees it.

    ``data``: the algorithm's per-row tensors (``x0`` for forward-process
    algorithms, latents and log-probs for GRPO); ``cond``: the rows'
    conditioning; ``advantages``: ``[B]``; ``draws``: the algorithm's per-row
    random draws (see :meth:`Algorithm.draw`), ``[passes, B, ...]``;
    ``weights``: ``[B]`` per-row loss weights (None = all 1).
    """

    data: dict[str, torch.Tensor]
    cond: Any
    advantages: torch.Tensor
    draws: dict[str, torch.Tensor]
    weights: torch.Tensor | None = None

    @property
    def x0(self) -> torch.Tensor:
        return self.data["x0"]


@dataclass
class StepEnd:
    """What an algorithm asks for after an optimizer step: copies to move, ``{role: decay}`` of
    ``theta_copy <- decay theta_copy + (1 - decay) theta`` (roles absent do not move), and values to log."""

    copy_decays: dict[str, float] = field(default_factory=dict)
    log: dict[str, float] = field(default_factory=dict)


class Algorithm:
    """An RL algorithm as the trainer drives it (module docstring); subclasses implement the hooks
    without a default (``rollout``, ``training_rows``, ``loss``, ``after_optimizer_step``)."""

    #: loss passes per batch (e.g. DiffusionNFT's training timesteps); gradients accumulate over them
    passes: int = 1
    #: the keys this algorithm adds to every step's metrics (its loss statistics, rows' and step end's
    #: logs), each with one line saying what it is (:mod:`flowrl.metric_keys`; a test checks a run's)
    metric_keys: ClassVar[dict[str, str]] = {}
    #: the weight copies the policy keeps besides the trained weights and the frozen reference:
    #: ``old`` (the anchor / behaviour policy), ``rollout`` (a separate rollout copy; else ``old`` samples)
    copies: tuple[str, ...] = ("old",)
    #: whether :meth:`state_dict` differs between processes (then a checkpoint keeps every process's)
    state_per_process: ClassVar[bool] = False

    def __init__(self, config: TrainConfig) -> None:
        self.train_config = config
        self.config = config.algorithm

    def prepare(self, policy: Policy) -> None:
        """Once, after the policy is built and before the first rollout (process-wide settings)."""

    def before_rollout(self, policy: Policy, records: list[dict], seeds: list[int], step: int) -> None:
        """Before step ``step``'s rollouts, with this process's prompt records and their seeds (one per
        sample): what an algorithm needs besides its own samples (off-policy data), and which weights the
        rollout copy holds. Nothing by default."""

    def noise_seeds(self, records: list[dict], seeds: list[int]) -> list[int]:
        """The seeds of the rollouts' initial noise for this process's ``records`` (default: the step's
        ``seeds``; the SDE noise is seeded by ``seeds`` whatever this returns)."""
        return seeds

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's own state across steps, saved in checkpoints (empty: none); with
        :attr:`state_per_process` each process's, all of them saved."""
        return {}

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps (collective: every process calls it): :meth:`state_dict`, or with
        :attr:`state_per_process` every process's (``{"per_process": [...]}``; nothing when all are empty)."""
        state = self.state_dict()
        if not self.state_per_process:
            return state
        per_process = gather_object([state])
        return {"per_process": per_process} if any(per_process) else {}

    def restore_state(self, state: dict[str, Any], process_index: int) -> None:
        """Load a checkpoint's :meth:`checkpoint_state` into this process's algorithm."""
        if self.state_per_process and state:
            state = state["per_process"][process_index]
        self.load_state_dict(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` from a checkpoint."""
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state, but the checkpoint holds {sorted(state)}"
            )

    def num_rows(self, num_samples: int, step: int = 1) -> int:
        """Training rows made from ``num_samples`` samples (whole groups), known before any rollout."""
        return num_samples

    def advantages(self, rewards: RewardBatch) -> torch.Tensor:
        """``[samples]`` advantages of the step's global batch (gathered from every process), computed once:
        group normalisation of the weighted total (``sum``) or GDPO's per-reward normalisation."""
        return reward_advantages(rewards, self.train_config.reward_aggregation, self.config.std_scope)

    def rollout(
        self,
        velocity: VelocityFn,
        noise: torch.Tensor,
        grid: torch.Tensor,
        cond: Any,
        generator: torch.Generator,
        step: int,
    ) -> RolloutChunk:
        """Roll out one micro-batch of whole groups from ``noise`` (one per sample) with the rollout
        ``velocity`` (guided as the sampler config says); ``generator`` draws SDE noise."""
        raise NotImplementedError

    def training_rows(
        self, chunks: list[RolloutChunk], advantages: torch.Tensor, rewards: torch.Tensor, step: int
    ) -> TrainRows:
        """The process's rows from its scored chunks; ``advantages`` and ``rewards`` are the process's
        ``[samples]`` slices of the global advantages and total rewards."""
        raise NotImplementedError

    def draw(
        self,
        generator: torch.Generator,
        num_samples: int,
        sample_shape: tuple[int, ...],
        grid: torch.Tensor,
        step: int,
    ) -> dict[str, torch.Tensor]:
        """Random draws for all ``num_samples`` samples of a step, each ``[passes, num_samples, ...]``; a
        training row gets the draws of its sample (``TrainRows.cond_index``).

        Drawn for the global batch from one generator, so that the result does
        not depend on how samples are split over processes. Only algorithms
        whose rows are samples (all of them, or some) draw anything.
        """
        return {}

    def loss(
        self, policy: Policy, batch: TrainBatch, pass_index: int, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The scalar loss (mean over rows, ``weights`` applied) of one pass over ``batch`` at training step
        ``step`` (1-based) and per-row statistics to log."""
        raise NotImplementedError

    def after_optimizer_step(self, step: int) -> StepEnd:
        """After training step ``step`` (1-based): which copies move, and values to log."""
        raise NotImplementedError


def weighted_mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``sum_i w_i values_i / B`` (a plain mean when ``weights`` is None): dropped rows count as zeros."""
    return values.mean() if weights is None else (values * weights.to(values)).mean()


def whole_groups(algorithm: str, num_samples: int, group_size: int) -> int:
    """The number of prompt groups in a process's ``num_samples``; a config error when they are not whole
    (for algorithms that look at a whole group at once)."""
    if num_samples % group_size:
        raise ConfigError(
            f"algorithm.name={algorithm!r} needs whole prompt groups on every process: {num_samples} images "
            f"per process are not groups of training.group_size={group_size}"
        )
    return num_samples // group_size
