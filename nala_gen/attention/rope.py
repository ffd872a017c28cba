"""2-D rotary position embedding (RoPE) for tokens laid out on an H x W grid.

The feature vector (size F, a multiple of 4) is read as F/2 pairs ``(x_i, x_{i+F/2})``; the first half of
the pairs rotates with the row index, the second half with the column index, at geometric frequencies.
For NaLa's cosine features the pair ``m * (cos theta, sin theta)`` rotates by adding the position angle to
theta, so the dot product depends on the relative offset of query and key.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def rope_2d(
    height: int,
    width: int,
    dim: int,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    first_row: int = 0,
) -> tuple[Tensor, Tensor]:
    """Cos and sin tables, each (H*W, dim/2), for features of size ``dim`` (row-major token order); with
    ``first_row``, rows ``first_row`` to ``first_row + H - 1`` of a taller grid's (the same rows of its tables)."""
    if dim % 4:
        raise ValueError(f"2-D RoPE needs a feature size divisible by 4, got {dim}")
    quarter = dim // 4
    freqs = base ** (-torch.arange(quarter, dtype=torch.float32, device=device) / quarter)
    rows = torch.arange(first_row, first_row + height, dtype=torch.float32, device=device)
    cols = torch.arange(width, dtype=torch.float32, device=device)
    row_angles = torch.outer(rows, freqs)[:, None, :].expand(height, width, quarter)
    col_angles = torch.outer(cols, freqs)[None, :, :].expand(height, width, quarter)
    angles = torch.cat((row_angles, col_angles), dim=-1).reshape(height * width, 2 * quarter)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., N, F) by the tables (N, F/2) from :func:`rope_2d`."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
