"""RL algorithms: one module each, its config dataclass beside it, one registry line each.

``algorithm.name`` in a config picks an entry of :data:`ALGORITHMS`: the
algorithm class (the trainer's hooks, :class:`Algorithm`) and its config
dataclass (the keys of the ``algorithm`` section). Adding an algorithm:
write ``my_algo.py`` (+ ``my_algo_config.py``), add one line here (or call
:func:`register_algorithm` from your own package), a recipe and a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flowrl.algorithms.base import Algorithm, RolloutChunk, StepEnd, TrainBatch, TrainRows
from flowrl.algorithms.branch_grpo import BranchGRPO
from flowrl.algorithms.crd import CRD
from flowrl.algorithms.crd_config import CRDConfig
from flowrl.algorithms.dragon import DRAGON
from flowrl.algorithms.dragon_config import DRAGONConfig
from flowrl.algorithms.flow_grpo import FlowGRPO
from flowrl.algorithms.fpo import FPO
from flowrl.algorithms.fpo_config import FPOConfig
from flowrl.algorithms.grpo_config import BranchGRPOConfig, FlowGRPOConfig
from flowrl.algorithms.meanflow_nft import MeanFlowNFT
from flowrl.algorithms.meanflow_nft_config import MeanFlowNFTConfig
from flowrl.algorithms.nft import DiffusionNFT
from flowrl.algorithms.nft_config import NFTConfig
from flowrl.algorithms.prdp import PRDP
from flowrl.algorithms.prdp_config import PRDPConfig
from flowrl.algorithms.raft import RAFT
from flowrl.algorithms.raft_config import RAFTConfig
from flowrl.algorithms.seppo import SePPO
from flowrl.algorithms.seppo_config import SePPOConfig
from flowrl.algorithms.tagrpo import TAGRPO
from flowrl.algorithms.tagrpo_config import TAGRPOConfig
from flowrl.config_schema import ConfigError
from flowrl.train_config import AlgorithmConfig

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass(frozen=True)
class AlgorithmEntry:
    """A registered algorithm: its class and its config dataclass."""

    algorithm: type[Algorithm]
    config: type[AlgorithmConfig]


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "nft": AlgorithmEntry(DiffusionNFT, NFTConfig),
    "meanflow_nft": AlgorithmEntry(MeanFlowNFT, MeanFlowNFTConfig),
    "crd": AlgorithmEntry(CRD, CRDConfig),
    "flow_grpo": AlgorithmEntry(FlowGRPO, FlowGRPOConfig),
    "branch_grpo": AlgorithmEntry(BranchGRPO, BranchGRPOConfig),
    "raft": AlgorithmEntry(RAFT, RAFTConfig),
    "fpo": AlgorithmEntry(FPO, FPOConfig),
    "prdp": AlgorithmEntry(PRDP, PRDPConfig),
    "seppo": AlgorithmEntry(SePPO, SePPOConfig),
    "dragon": AlgorithmEntry(DRAGON, DRAGONConfig),
    "tagrpo": AlgorithmEntry(TAGRPO, TAGRPOConfig),
}


def register_algorithm(name: str, algorithm: type[Algorithm], config: type[AlgorithmConfig]) -> None:
    """Make ``algorithm.name: <name>`` select ``algorithm`` with the keys of ``config``."""
    if not issubclass(config, AlgorithmConfig):
        raise TypeError(f"{config.__name__} must subclass AlgorithmConfig")
    ALGORITHMS[name] = AlgorithmEntry(algorithm, config)


def algorithm_entry(name: str) -> AlgorithmEntry:
    """The registered algorithm called ``name``; an unknown name is an error naming the allowed ones."""
    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm.name={name!r} is not allowed; allowed: {list(ALGORITHMS)}")
    return ALGORITHMS[name]


def build_algorithm(config: TrainConfig) -> Algorithm:
    """The algorithm named by ``config.algorithm.name`` for a validated ``TrainConfig``."""
    return algorithm_entry(config.algorithm.name).algorithm(config)


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmConfig",
    "AlgorithmEntry",
    "BranchGRPO",
    "CRD",
    "DRAGON",
    "DiffusionNFT",
    "FPO",
    "FlowGRPO",
    "MeanFlowNFT",
    "PRDP",
    "RAFT",
    "RolloutChunk",
    "TAGRPO",
    "SePPO",
    "StepEnd",
    "TrainBatch",
    "TrainRows",
    "algorithm_entry",
    "build_algorithm",
    "register_algorithm",
]
