"""The attention layers of :class:`~flowrl.models.shapes_dit.ShapesDiT`'s video variant, and the attention
kernel every layer of the model calls.

:class:`TemporalAttention` is the layer a factorized video block adds after its within-frame attention.
Its ``radius`` decides what a token sees across frames:

- ``radius = 0``: the token's own patch position in every frame (``T`` keys). An object that moves
  leaves the position, so evidence about it is pooled only along *still* tracks.
- ``radius = R > 0``: every token of every frame within ``R`` patches of its position (Chebyshev
  distance, ``T (2R + 1)^2`` keys at most), with a learned bias per head and offset::

      a_ij = softmax_j( q_i . k_j / sqrt(d) + b_h(t_j - t_i, y_j - y_i, x_j - x_i) ),   |y_j - y_i|, |x_j - x_i| <= R

  so a head can follow an object that moves ``(dx, dy)`` patches per frame by raising the bias along
  ``(dt, dt dy, dt dx)`` (Video Swin's relative position bias, Liu et al. 2022, over a window centred on
  the query rather than a fixed tiling). This is what lets a model gather the faint evidence of a moving
  object across frames at high noise, where the decision to move is made.

Both start as the identity (zero output projection) and the bias starts at zero. The bias is stored
divided by :data:`BIAS_SCALE`: AdamW moves every weight by about the learning rate per step, and a bias
must travel several units to single out one track, so its steps are made that many times larger.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: the relative bias is ``BIAS_SCALE * relative_bias`` (module docstring)
BIAS_SCALE = 10.0


def cpu_autocast_enabled(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and torch.is_autocast_enabled("cpu")


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + mask) v`` (``F.scaled_dot_product_attention``). Under CPU autocast it
    runs in float32: torch's CPU flash-attention backward in bfloat16 took 436 ms against 46 ms in float32
    for one forward and backward of 32 shapes images (torch 2.14.1, one thread), which ate the bfloat16
    matrix products' gain; the projections around it stay in bfloat16."""
    if not cpu_autocast_enabled(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    with torch.autocast("cpu", enabled=False):
        attended = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask)
    return attended.to(q.dtype)


def neighbourhood_offsets(frames: int, grid: int, radius: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For tokens in frame-major order (``t * grid^2 + y * grid + x``): ``index [L, L]``, each pair's offset
    ``(dt, dy, dx)`` as a row of the bias table ``[(2T - 1) (2R + 1)^2]``, and ``inside [L, L]``, whether
    the pair is within ``radius`` patches."""
    t, y, x = torch.meshgrid(torch.arange(frames), torch.arange(grid), torch.arange(grid), indexing="ij")
    t, y, x = t.flatten(), y.flatten(), x.flatten()
    dt, dy, dx = (c[None, :] - c[:, None] for c in (t, y, x))
    inside = (dy.abs() <= radius) & (dx.abs() <= radius)
    side = 2 * radius + 1
    row, column = dy.clamp(-radius, radius) + radius, dx.clamp(-radius, radius) + radius
    return ((dt + frames - 1) * side + row) * side + column, inside


class TemporalAttention(nn.Module):
    """Attention across frames, ``x + W_o attn(LN(x))`` with ``W_o = 0`` at init (module docstring).

    Tokens ``[B, T N, D]`` (frame-major) attend over their ``T`` frames at the same position
    (``radius = 0``), or over the ``(2R + 1)^2`` positions around theirs in every frame with a learned
    relative bias (``radius = R``; ``frames`` and ``grid``, the patches per side, fix the table).
    """

    def __init__(self, hidden: int, heads: int, radius: int = 0, frames: int = 1, grid: int = 1) -> None:
        super().__init__()
        self.heads = heads
        self.radius = radius
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        if radius:
            index, inside = neighbourhood_offsets(frames, grid, radius)
            self.relative_bias = nn.Parameter(torch.zeros(heads, (2 * frames - 1) * (2 * radius + 1) ** 2))
            self.register_buffer("bias_index", index, persistent=False)
            self.register_buffer("inside", inside, persistent=False)

    def forward(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        if self.radius:
            return x + self.out(self._neighbourhood(x))
        batch, length, width = x.shape
        positions = length // frames
        # [B, T N, D] -> [B N, heads, T, D / heads]
        q, k, v = (
            part.view(batch, frames, positions, self.heads, width // self.heads)
            .permute(0, 2, 3, 1, 4)
            .reshape(batch * positions, self.heads, frames, width // self.heads)
            for part in self.qkv(self.norm(x)).chunk(3, -1)
        )
        attended = attention(q, k, v)
        attended = attended.view(batch, positions, self.heads, frames, width // self.heads)
        return x + self.out(attended.permute(0, 3, 1, 2, 4).reshape(batch, length, width))

    def _neighbourhood(self, x: torch.Tensor) -> torch.Tensor:
        """The attended values ``[B, L, D]`` of the ``radius > 0`` layer (one masked attention over the clip)."""
        batch, length, width = x.shape
        q, k, v = (
            part.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
            for part in self.qkv(self.norm(x)).chunk(3, -1)
        )
        bias = (BIAS_SCALE * self.relative_bias.float())[:, self.bias_index].masked_fill(
            ~self.inside, float("-inf")
        )
        # float32 under CPU autocast (where attention runs in float32), else the queries' dtype
        attended = attention(
            q, k, v, attn_mask=bias[None] if cpu_autocast_enabled(q) else bias[None].to(q.dtype)
        )
        return attended.transpose(1, 2).reshape(batch, length, width)
