"""The ``algorithm`` sections of Flow-GRPO (``name: flow_grpo``) and BranchGRPO (``name: branch_grpo``).

Both share :class:`GRPOConfig`: the Flow-SDE, the clipped ratio, the KL to the
reference and the SDE window (MixGRPO).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.config_schema import ConfigError, at_least, choice
from flowrl.train_config import AlgorithmConfig

SDE_VARIANTS = ("flow", "dance", "cps", "cps_gaussian")

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class GRPOConfig(AlgorithmConfig):
    """What both GRPO variants read (:mod:`flowrl.algorithms.grpo`)."""

    #: eps of the ratio clip ``clip(rho, 1 - eps, 1 + eps)``
    clip_range: float = field(default=1e-4, metadata=at_least(0.0, strict=True))
    #: beta_KL of the KL to the frozen reference on the step means
    kl_weight: float = field(default=0.04, metadata=at_least(0.0))
    #: the KL's scale: ``reference`` divides ``||mu_theta - mu_ref||²`` by ``2 std_dev_t²`` as Flow-GRPO's
    #: code does (no ``sqrt(dt)``: the paper's beta values port unchanged); ``exact`` is the closed-form KL
    #: of the two step Gaussians, ``/ (2 std_dev_t² |dt|)`` (1 / |dt| times larger, 10x on a 10-step grid)
    kl_form: str = field(default="reference", metadata=choice("reference", "exact"))
    #: the Flow-SDE noise level a
    noise_level: float = field(default=0.7, metadata=at_least(0.0, strict=True))
    #: ``flow`` (Flow-SDE), ``dance`` (DanceGRPO's step, std = noise_level sqrt(|dt|), BranchGRPO's code),
    #: ``cps`` (coefficient-preserving, scored as Flow-GRPO's code: ``-mean ||x' - mu||²``) or
    #: ``cps_gaussian`` (the same step scored by its exact Gaussian log-density)
    sde_variant: str = field(default="flow", metadata=choice(*SDE_VARIANTS))
    #: steps ``[start, start + size)`` are stochastic (0 = all but the last); with ``sde_window_slide``
    #: the window moves ``sde_window_stride`` steps every ``sde_window_every`` iterations (MixGRPO)
    sde_window_size: int = field(default=0, metadata=at_least(0))
    #: first stochastic step of the SDE window
    sde_window_start: int = field(default=0, metadata=at_least(0))
    #: slide the SDE window over the steps as training goes (MixGRPO)
    sde_window_slide: bool = False
    #: steps the sliding window moves each time
    sde_window_stride: int = field(default=1, metadata=at_least(1))
    #: iterations between moves of the sliding window
    sde_window_every: int = field(default=1, metadata=at_least(1))
    #: train the CFG-guided velocity (sampler.guidance_scale) with the unconditional branch detached
    train_guidance: bool = False

    def check(self, config: TrainConfig) -> None:
        """The SDE window agrees with the sampler's step count."""
        steps = config.sampler.num_steps
        if steps < 2:
            raise ConfigError(f"sampler.num_steps={steps} is not allowed for {self.name}; it needs >= 2")
        if self.sde_window_size and (
            self.sde_window_size > steps - 1
            or (not self.sde_window_slide and self.sde_window_start + self.sde_window_size > steps - 1)
        ):
            raise ConfigError(
                f"algorithm.sde_window_start={self.sde_window_start} + sde_window_size="
                f"{self.sde_window_size} is not allowed; the window must lie in the first {steps - 1} steps "
                f"(sampler.num_steps={steps}; the last step is deterministic)"
            )


@dataclass
class FlatGRPOConfig(GRPOConfig):
    """What the GRPO variants with groups of independent samples (no tree) share: Flow-GRPO and PRDP."""

    #: all samples of a group start from the same noise (they differ by their SDE noise only)
    same_group_noise: bool = False

    def check(self, config: TrainConfig) -> None:
        super().check(config)
        if self.same_group_noise and config.training.micro_batch_size % config.training.group_size:
            raise ConfigError(
                f"training.micro_batch_size={config.training.micro_batch_size} is not allowed with "
                f"algorithm.same_group_noise; it must be a multiple of group_size={config.training.group_size}"
            )


@dataclass
class FlowGRPOConfig(FlatGRPOConfig):
    """Flat Flow-GRPO (:mod:`flowrl.algorithms.flow_grpo`)."""

    name: str = "flow_grpo"
    #: share of each sample's stochastic steps trained per iteration: ``floor(fraction * steps)`` (at least 1)
    timestep_fraction: float = field(default=1.0, metadata={"min": 0.0, "strict": True, "max": 1.0})
    #: which of them: the ``first`` ones in order, as Flow-GRPO's code does, or a ``random`` subset per sample
    trained_steps: str = field(default="first", metadata=choice("first", "random"))
    #: groups whose rewards are all equal get weight 0 in the loss, which averages over the kept samples
    drop_zero_std_groups: bool = False
    #: lambda of ``lambda ||v_theta(x_k, t_k) - v_ref(x_k, t_k)||²`` at one deterministic (ODE) step ``k`` of each
    #: sample's rollout per pass, drawn uniformly: the steps an SDE window leaves untrained, which the shared
    #: network still changes, held to the frozen reference (0: none, Flow-GRPO's own loss)
    ode_anchor_weight: float = field(default=0.0, metadata=at_least(0.0))


@dataclass
class BranchGRPOConfig(GRPOConfig):
    """BranchGRPO (:mod:`flowrl.algorithms.branch_grpo`): the tree, node rewards and pruning.

    The defaults are those of BranchGRPO's code (Fredreic1849/BranchGRPO, ``train_branchgrpo_flux.py`` and
    its launch script): DanceGRPO's SDE at eta = 0.3 with x4 noise at splits (scored with the unscaled
    std), no KL, clip 1e-3, the last step trained, advantages per tree and depth with the sample std.
    """

    name: str = "branch_grpo"
    #: the divisor of a depth's advantages: the std of the depth's nodes in the tree (``group``, the
    #: reference), pooled over the global batch (``batch``), or the std of the tree's leaf rewards (``leaves``)
    std_scope: str = field(default="group", metadata=choice("batch", "group", "leaves"))
    clip_range: float = field(default=1e-3, metadata=at_least(0.0, strict=True))
    kl_weight: float = field(default=0.0, metadata=at_least(0.0))
    noise_level: float = field(default=0.3, metadata=at_least(0.0, strict=True))
    sde_variant: str = field(default="dance", metadata=choice(*SDE_VARIANTS))
    #: steps at which every node of the tree branches (their count and branching give group_size =
    #: branching ** len(split_steps))
    split_steps: list[int] = field(default_factory=lambda: [0, 2, 4])
    #: children per node at each split step
    branching: int = field(default=2, metadata=at_least(2))
    #: the noise level of split steps (None = ``noise_level``); a consistent alternative to the scale below
    split_noise_level: float | None = None
    #: the noise drawn at split steps is multiplied by this, its log-probability keeps the unscaled std
    #: (the reference's ``split_noise_scale``: 4; 1 = every transition scored by the noise it drew)
    split_noise_scale: float = field(default=4.0, metadata=at_least(0.0, strict=True))
    #: the last step (to t = 0) is stochastic and trained, as in the reference (no SDE window only)
    train_last_step: bool = True
    #: an internal node's reward: the mean of its leaves' rewards, or fusion (children weighted by the
    #: softmax of their transition log-probs)
    node_reward: str = field(default="mean", metadata=choice("mean", "fusion"))
    #: depth-wise advantages: ``sample`` std (n - 1) + 1e-8 and 0 below a std of 1e-6 (the reference), or
    #: flowrl's earlier ``population`` std + 1e-4
    depth_std: str = field(default="sample", metadata=choice("sample", "population"))
    #: depth pruning (the reference's): depths whose incoming transitions are not trained (depth d = the
    #: transition of step d - 1); with ``depth_pruning_slide`` they move one depth shallower every
    #: ``depth_pruning_interval`` iterations until the shallowest reaches ``depth_pruning_stop_depth``
    #: (None = the last split step)
    depth_pruning: list[int] = field(default_factory=list)
    #: slide the pruned depths one shallower every depth_pruning_interval iterations
    depth_pruning_slide: bool = False
    #: iterations between slides of the pruned depths
    depth_pruning_interval: int = field(default=30, metadata=at_least(1))
    #: the sliding stops once the shallowest pruned depth reaches this (None = the last split step)
    depth_pruning_stop_depth: int | None = field(default=None, metadata=at_least(0))
    #: width pruning of the transitions after the last split (the reference's modes): ``none``,
    #: ``best_half`` (mode 1: the best half of each branch), ``best_and_worst`` (mode 2: the best and worst
    #: quarter pooled over the process's trees), or flowrl's ``quartiles`` (per tree and depth at every
    #: depth, the best and worst quarter of nodes)
    width_pruning: str = field(
        default="none", metadata=choice("none", "best_half", "best_and_worst", "quartiles")
    )
    #: flowrl's depth window (a variant): train only edges into depths ``[start, start + size)`` (0 = all),
    #: sliding deeper by one per iteration and wrapping with ``depth_window_slide``
    depth_window_size: int = field(default=0, metadata=at_least(0))
    #: first trained depth of the depth window
    depth_window_start: int = field(default=0, metadata=at_least(0))
    #: slide the depth window one deeper per iteration, wrapping around
    depth_window_slide: bool = False

    def check(self, config: TrainConfig) -> None:
        """The tree's shape agrees with the sampler's steps, the group size and the micro-batches."""
        super().check(config)
        steps = config.sampler.num_steps
        bad = [split for split in self.split_steps if not 0 <= split < steps - 1]
        if bad or not self.split_steps or len(set(self.split_steps)) != len(self.split_steps):
            raise ConfigError(
                f"algorithm.split_steps={self.split_steps} is not allowed; give distinct steps in "
                f"[0, {steps - 2}] (sampler.num_steps={steps}; the last step is deterministic)"
            )
        leaves = self.branching ** len(self.split_steps)
        if config.training.group_size != leaves:
            raise ConfigError(
                f"training.group_size={config.training.group_size} is not allowed for branch_grpo; it must "
                f"equal branching ** len(split_steps) = {self.branching} ** {len(self.split_steps)} = {leaves} "
                "(the leaves of one tree)"
            )
        if config.training.micro_batch_size % leaves:
            raise ConfigError(
                f"training.micro_batch_size={config.training.micro_batch_size} is not allowed for branch_grpo; "
                f"it must be a multiple of the {leaves} leaves of a tree (rollouts are whole trees)"
            )
        if self.std_scope == "batch" and self.node_reward == "fusion":
            raise ConfigError(
                "algorithm.std_scope='batch' is not allowed with node_reward='fusion'; the pooled depth std is "
                "taken over the global batch from the leaf rewards, which needs node_reward='mean'"
            )
        bad_depths = [depth for depth in self.depth_pruning if not 1 <= depth <= steps]
        if bad_depths:
            raise ConfigError(
                f"algorithm.depth_pruning={self.depth_pruning} is not allowed; depths lie in [1, {steps}] "
                f"(sampler.num_steps={steps})"
            )
        if self.depth_window_size and self.depth_window_size > steps - 1:
            raise ConfigError(
                f"algorithm.depth_window_size={self.depth_window_size} is not allowed; at most {steps - 1} "
                f"(the stochastic depths of sampler.num_steps={steps})"
            )
