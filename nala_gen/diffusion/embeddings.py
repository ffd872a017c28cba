"""Conditioning and position embeddings of the NaLa DiT: 2-D sin-cos positions and one timestep + class embedder.

Positions are computed at forward time for the actual (H/p, W/p) patch grid, so a model trained at one size
runs at any other size and aspect ratio without a stored table to resize.
"""

from __future__ import annotations

import torch
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from torch import nn

Tensor = torch.Tensor

# DiT's sinusoid size for the timestep before its MLP.
TIMESTEP_FREQ_DIM = 256


def _sincos_1d(positions: Tensor, dim: int) -> Tensor:
    """(n,) positions -> (n, dim) ``[sin(pos * w), cos(pos * w)]`` at geometric frequencies w."""
    half = dim // 2
    omega = 1.0 / 10000 ** (torch.arange(half, dtype=torch.float32, device=positions.device) / half)
    angles = torch.outer(positions, omega)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def sincos_pos_embed_2d(
    dim: int,
    height: int,
    width: int,
    scale: float = 1.0,
    device: torch.device | str | None = None,
) -> Tensor:
    """Fixed 2-D sin-cos position embeddings, (height * width, dim) float32, row-major token order.

    The first half of the channels encodes the row index, the second half the column index (as in DiT/MAE).
    ``scale`` multiplies both indices (one factor for both, so the aspect ratio is kept).
    """
    if dim % 4:
        raise ValueError(f"2-D sin-cos position embeddings need a size divisible by 4, got {dim}")
    rows = torch.arange(height, dtype=torch.float32, device=device) * scale
    cols = torch.arange(width, dtype=torch.float32, device=device) * scale
    row_emb = _sincos_1d(rows, dim // 2)[:, None, :].expand(height, width, dim // 2)
    col_emb = _sincos_1d(cols, dim // 2)[None, :, :].expand(height, width, dim // 2)
    return torch.cat((row_emb, col_emb), dim=-1).reshape(height * width, dim)


class TimestepClassEmbedding(nn.Module):
    """The single conditioning vector c = MLP(sinusoid(t)) + E[y], shape (B, hidden).

    The class table has ``num_classes + 1`` rows; row ``num_classes`` is the null class used for classifier-free
    guidance. The module never drops labels itself: training code replaces labels by ``num_classes`` where it
    wants the unconditional branch, so evaluation and training see exactly the labels they were given.
    """

    def __init__(self, hidden_size: int, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        # [cos, sin] order and no frequency shift: DiT's timestep sinusoid.
        self.time_proj = Timesteps(TIMESTEP_FREQ_DIM, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.timestep_embedder = TimestepEmbedding(TIMESTEP_FREQ_DIM, hidden_size)
        self.class_embedder = nn.Embedding(num_classes + 1, hidden_size)

    def forward(self, timestep: Tensor, class_labels: Tensor, dtype: torch.dtype) -> Tensor:
        """timestep (B,) float, class_labels (B,) int in [0, num_classes] -> (B, hidden) in ``dtype``."""
        if class_labels.min() < 0 or class_labels.max() > self.num_classes:
            raise ValueError(f"class labels must lie in [0, {self.num_classes}] ({self.num_classes} = null class)")
        t_emb = self.timestep_embedder(self.time_proj(timestep).to(dtype))
        return t_emb + self.class_embedder(class_labels).to(dtype)
