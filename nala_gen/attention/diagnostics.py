"""Diagnostics: how sharp is each kernel's attention, and does it react to the query norm?

The paper's claim (Figures 1 and 3): for softmax, a longer query gives a peakier (lower-entropy) attention;
linear attention with a homogeneous feature map such as ReLU cancels the query norm, so its entropy does not
move; NaLa restores the dependence through its norm-aware power.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .functional import attention_weights

Tensor = torch.Tensor


def attention_entropy(q: Tensor, k: Tensor, kernel: str = "nala", **kernel_options) -> Tensor:
    """Per-query Shannon entropy (nats) of the attention distribution: (B, h, N_q, d) -> (B, h, N_q)."""
    weights = attention_weights(q, k, kernel, **kernel_options).double()
    return -(weights * torch.log(weights.clamp_min(1e-300))).sum(dim=-1)


def query_norm_entropy(q: Tensor, k: Tensor, kernels: tuple[str, ...], **kernel_options) -> dict[str, Tensor]:
    """Per-query norm and entropy under each kernel, for recorded queries and keys of a real model.

    q, k: (B, heads, N, d) as given to the attention op (before any kernel or RoPE). Weights are built one batch
    item at a time (O(heads * N^2) memory), so keep N to a few thousand. Returns ``{"norm": (M,), kernel: (M,)}``
    with M = B * heads * N, float64.
    """
    result = {"norm": torch.linalg.vector_norm(q.double(), dim=-1).flatten()}
    for kernel in kernels:
        per_item = [attention_entropy(q[i : i + 1], k[i : i + 1], kernel, **kernel_options) for i in range(len(q))]
        result[kernel] = torch.cat([e.flatten() for e in per_item])
    return result


def entropy_vs_query_norm(
    kernels: tuple[str, ...] = ("softmax", "nala", "relu"),
    norms: Tensor | None = None,
    head_dim: int = 32,
    num_keys: int = 256,
    seed: int = 0,
    save_png: str | Path | None = None,
) -> dict[str, dict[str, list[float]]]:
    """Entropy of one query direction scaled to each norm, against fixed random keys.

    Returns ``{kernel: {"norm": [...], "entropy": [...]}}``; with ``save_png`` also writes a plot
    (needs matplotlib, the ``plot`` extra).
    """
    gen = torch.Generator().manual_seed(seed)
    norms = torch.linspace(0.25, 8.0, 32, dtype=torch.float64) if norms is None else norms.double()
    direction = torch.randn(head_dim, generator=gen, dtype=torch.float64)
    direction /= direction.norm()
    keys = torch.randn(1, 1, num_keys, head_dim, generator=gen, dtype=torch.float64)
    queries = (norms[:, None] * direction)[None, None]
    result = {
        kernel: {
            "norm": norms.tolist(),
            "entropy": attention_entropy(queries, keys, kernel)[0, 0].tolist(),
        }
        for kernel in kernels
    }
    if save_png is not None:
        plot_entropy(result, save_png)
    return result


def plot_entropy(result: dict[str, dict[str, list[float]]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    for kernel, series in result.items():
        ax.plot(series["norm"], series["entropy"], marker=".", label=kernel)
    ax.set_xlabel("query norm ‖q‖ (fixed direction)")
    ax.set_ylabel("attention entropy (nats)")
    ax.set_title("Entropy vs query norm")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
