"""A set-level reward: the Fréchet distance of a batch's features to an exemplar set (DRAGON's
distribution-to-distribution reward), handed to per-sample algorithms as each sample's contribution.

For a set ``S`` of feature vectors with mean ``mu_S`` and covariance ``C_S`` (unbiased, ``1/(n-1)``) and the
exemplar set's ``mu_E``, ``C_E``::

    FD(S, E) = ||mu_S - mu_E||² + Tr( C_S + C_E - 2 (C_S^{1/2} C_E C_S^{1/2})^{1/2} )

the Fréchet (2-Wasserstein) distance of the two Gaussians (FID's formula; the matrix square roots through
symmetric eigendecompositions in float64). The scored set is the batch the reward is given, a rollout
micro-batch in training. Each sample's score is what the set's distance loses by having it::

    contribution_i = FD(S without i, E) - FD(S, E)          (> 0: sample i brings the set closer)

(primary score; DRAGON ranks samples by it to build its positive and negative sets) and ``distance`` is
``FD(S, E)`` itself, the same for every row (the target a run should lower; ``reward/exemplar_fd/distance``).

The encoder, ``pooled_pixels``: each image ``[3, H, W]`` in [0, 1] is average-pooled to ``grid x grid``
cells per channel, a ``3 grid²`` vector (48 at ``grid`` 4). It has no weights and sees colour and layout,
what the shapes world's scenes differ in; a learned encoder (CLIP, as DRAGON's CLAP) plugs in the same way.

Exemplars: ``shapes`` (``rewards/assets/shapes_exemplars.npz``: the 364 training prompts of the shapes world rendered
prompts, made by ``scripts/make_exemplars.py``), or a path to an ``.npz`` whose ``images`` array is
``[N, H, W, 3]`` uint8, or a folder of PNG/JPEG images.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

ASSETS = Path(__file__).resolve().parent / "assets"
#: exemplar sets shipped by name
SHIPPED_EXEMPLARS = {"shapes": ASSETS / "shapes_exemplars.npz"}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def pooled_pixels(images: torch.Tensor, grid: int) -> torch.Tensor:
    """``[B, 3 grid²]`` features: each channel of ``[B, 3, H, W]`` images averaged over ``grid x grid`` cells."""
    return F.adaptive_avg_pool2d(images.detach().float().clamp(0, 1), grid).flatten(1).double()


def psd_sqrt(matrix: torch.Tensor) -> torch.Tensor:
    """The symmetric square root of a positive semi-definite matrix (negative eigenvalues of round-off: 0)."""
    values, vectors = torch.linalg.eigh((matrix + matrix.T) / 2)
    return (vectors * values.clamp(min=0).sqrt()) @ vectors.T


def frechet_distance(
    mean: torch.Tensor, covariance: torch.Tensor, ref_mean: torch.Tensor, ref_cov: torch.Tensor
) -> float:
    """``FD`` of the module docstring between two Gaussians."""
    root = psd_sqrt(covariance)
    cross = torch.linalg.eigvalsh(root @ ref_cov @ root).clamp(min=0).sqrt().sum()
    return float((mean - ref_mean).pow(2).sum() + covariance.trace() + ref_cov.trace() - 2 * cross)


def moments(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased covariance of ``[n, d]`` features (``n >= 2``)."""
    return features.mean(dim=0), torch.cov(features.T, correction=1).reshape(features.shape[1], -1)


def load_exemplar_images(exemplars: str | Path) -> np.ndarray:
    """``[N, H, W, 3]`` uint8 exemplar images from a shipped name, an ``.npz`` or a folder of images."""
    path = SHIPPED_EXEMPLARS.get(str(exemplars), Path(exemplars))
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(
                f"exemplars={str(exemplars)!r}: the folder holds no {'/'.join(IMAGE_SUFFIXES)} images"
            )
        return np.stack([np.asarray(Image.open(file).convert("RGB")) for file in files])
    if path.suffix == ".npz" and path.is_file():
        with np.load(path, allow_pickle=False) as archive:
            return archive["images"]
    raise ValueError(
        f"exemplars={str(exemplars)!r} is not allowed; use a shipped set {sorted(SHIPPED_EXEMPLARS)}, an .npz "
        "with an 'images' array [N, H, W, 3] uint8, or a folder of images"
    )


class ExemplarFD:
    """The set-level reward of the module docstring."""

    modality = "image"
    primary_score = "contribution"
    score_keys = ("contribution", "distance")

    def __init__(self, exemplars: str = "shapes", grid: int = 4) -> None:
        if not isinstance(grid, int) or grid < 1:
            raise ValueError(f"exemplar_fd grid={grid!r} is not allowed; use a positive integer")
        images = load_exemplar_images(exemplars)
        if images.ndim != 4 or images.shape[-1] != 3 or len(images) < 2:
            raise ValueError(
                f"exemplars={exemplars!r}: expected at least 2 images [N, H, W, 3], got {images.shape}"
            )
        self.grid = grid
        exemplar_images = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
        self.mean, self.covariance = moments(pooled_pixels(exemplar_images, grid))

    def distance(self, features: torch.Tensor) -> float:
        return frechet_distance(*moments(features), self.mean, self.covariance)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"exemplar_fd expects images [B, 3, H, W], got shape {tuple(images.shape)}")
        if images.shape[0] < 3:
            raise ValueError(
                f"exemplar_fd scores sets: it needs at least 3 images per batch, got {images.shape[0]}"
            )
        features = pooled_pixels(images, self.grid)
        whole = self.distance(features)
        rows = torch.arange(features.shape[0])
        without = [self.distance(features[rows != i]) for i in range(features.shape[0])]
        return {
            "contribution": torch.tensor(without, dtype=torch.float64).sub(whole).float(),
            "distance": torch.full((features.shape[0],), whole, dtype=torch.float32),
        }
