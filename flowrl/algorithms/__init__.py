"""RL algorithms: one module each; the trainer picks one by ``algorithm.name``."""

from flowrl.algorithms.base import Algorithm, Policy, TrainBatch
from flowrl.algorithms.nft import DiffusionNFT
from flowrl.config import AlgorithmConfig

ALGORITHMS = {"nft": DiffusionNFT}


def build_algorithm(config: AlgorithmConfig) -> Algorithm:
    """The algorithm named by ``config.name``."""
    return ALGORITHMS[config.name](config)


__all__ = ["ALGORITHMS", "Algorithm", "DiffusionNFT", "Policy", "TrainBatch", "build_algorithm"]
