"""The ``algorithm`` section of MeanFlowNFT (``name: meanflow_nft``): DiffusionNFT's keys plus ``meanflow_*``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.nft_config import NFTConfig
from flowrl.config_schema import ConfigError, at_least, choice

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class MeanFlowNFTConfig(NFTConfig):
    """MeanFlowNFT (:mod:`flowrl.algorithms.meanflow_nft`): how d/dt u is taken and which interval is trained."""

    name: str = "meanflow_nft"
    #: a no-grad ``central`` difference on the old model, shared by theta and old (the reference's only
    #: method), or ``jvp`` through theta (then V_theta also carries theta's own derivative)
    meanflow_derivative: str = field(default="central", metadata=choice("jvp", "central"))
    #: the central difference's time step h (the reference's ``central_diff_epsilon`` 5 of T = 1000)
    meanflow_step: float = field(default=5e-3, metadata=at_least(0.0, strict=True))
    #: which interval ``[r, t]`` is trained (module docstring of the algorithm)
    meanflow_interval: str = field(default="pairs", metadata=choice("pairs", "grid", "equal", "uniform"))
    #: ``pairs``: shares of rows with r = t and with r = 0 (MeanFlow's own draws)
    meanflow_equal_share: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    #: pairs: share of rows with r = 0 (the one-step map from t)
    meanflow_zero_share: float = field(default=0.25, metadata={"min": 0.0, "max": 1.0})

    def check(self, config: TrainConfig) -> None:
        super().check(config)
        shares = self.meanflow_equal_share + self.meanflow_zero_share
        if self.meanflow_interval == "pairs" and shares > 1:
            raise ConfigError(
                f"algorithm.meanflow_equal_share={self.meanflow_equal_share} + "
                f"algorithm.meanflow_zero_share={self.meanflow_zero_share} = {shares:g} is not allowed; "
                "the two shares of rows must sum to at most 1"
            )
