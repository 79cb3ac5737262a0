"""RL algorithms: one module each; the trainer picks one by ``algorithm.name``."""

from flowrl.algorithms.base import Algorithm, Policy, RolloutChunk, TrainBatch, TrainRows
from flowrl.algorithms.crd import CRD
from flowrl.algorithms.grpo import BranchGRPO, FlowGRPO
from flowrl.algorithms.meanflow_nft import MeanFlowNFT
from flowrl.algorithms.nft import DiffusionNFT
from flowrl.config import TrainConfig

ALGORITHMS = {
    "nft": DiffusionNFT,
    "meanflow_nft": MeanFlowNFT,
    "crd": CRD,
    "flow_grpo": FlowGRPO,
    "branch_grpo": BranchGRPO,
}


def build_algorithm(config: TrainConfig) -> Algorithm:
    """The algorithm named by ``config.algorithm.name``."""
    return ALGORITHMS[config.algorithm.name](config)


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BranchGRPO",
    "CRD",
    "DiffusionNFT",
    "FlowGRPO",
    "MeanFlowNFT",
    "Policy",
    "RolloutChunk",
    "TrainBatch",
    "TrainRows",
    "build_algorithm",
]
