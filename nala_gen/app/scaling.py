"""The Scaling tab's data: committed benchmark results, live in-process measurements, and computed memory.

Attention is measured as in ``nala-bench attention`` (q, k, v of shape (1, 4 heads, N, 32), fp32, CPU): the
peak memory is what the op adds above the inputs. A method whose memory or time would not fit a live run is not
run: its memory is computed from its shapes and marked "computed, not measured", and the committed figure of
the benchmark (fresh process per point) is shown instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HEADS, HEAD_DIM, ESRT_SPLITS = 4, 32, 4
SDPA_LIVE_MAX_TOKENS = 16_384  # SDPA is O(N^2) time: ~1 s at 16K tokens here, 35 s at 70K
LIVE_BUDGET_BYTES = 2 * 2**30
TOKEN_CHOICES = (1024, 4096, 16_384, 65_536, 71_680)

METHODS = {
    "nala": "NaLa (linear; the fused op on CPU)",
    "nala_eager": "NaLa, PyTorch path (before the fused op)",
    "nala_compiled": "NaLa, PyTorch path with torch.compile",
    "nala_split": "NaLa split",
    "relu": "ReLU linear",
    "softmax_sdpa": "softmax, fused SDPA",
    "esrt_split": "ESRT split softmax (EMHA, 4 splits)",
    "softmax_explicit": "softmax, explicit N×N",
    "naladit_step": "NaLaDiT-tiny denoising step (NaLa)",
}
LIVE_METHODS = ("nala", "softmax_sdpa", "esrt_split", "softmax_explicit", "naladit_step")
SR_MODELS = {"nalasr": "NaLaSR-light", "esrt": "ESRT", "swinir": "SwinIR-light"}
COLUMNS = ["source", "method", "tokens", "latency (s)", "peak memory (MiB)", "note"]


def needs_bytes(method: str, tokens: int, heads: int = HEADS) -> int | None:
    """Memory of the score matrices a method materialises (fp32), or None for methods linear in N.

    Explicit softmax keeps two (heads, N, N) matrices (scores and their softmax); ESRT's split attention keeps two
    (heads, N/s, N/s) ones of one segment at a time.
    """
    from nala_gen.attention.registry import explicit_bytes

    if method == "softmax_explicit":
        return explicit_bytes(tokens, heads)
    if method == "esrt_split":
        return 2 * heads * math.ceil(tokens / ESRT_SPLITS) ** 2 * 4
    return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 2**20:.0f} MiB"


def _row(source: str, method: str, tokens: int, latency, memory_bytes, note: str = "") -> list:
    return [
        source,
        METHODS.get(method, SR_MODELS.get(method, method)),
        int(tokens),
        None if latency is None else round(float(latency), 4),
        None if memory_bytes is None else round(memory_bytes / 2**20, 1),
        note,
    ]


# ------------------------------------------------------------------------------------------------- committed
def committed_attention(results_dir: Path) -> list[list]:
    """Rows of ``attention_scaling.json`` plus ESRT split attention's computed memory at the same sizes."""
    path = Path(results_dir) / "attention_scaling.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    rows, sizes = [], []
    for r in data.get("rows", []):
        sizes.append(r["tokens"])
        if r.get("status") == "ok":
            rows.append(_row("committed", r["method"], r["tokens"], r["latency_s"], r["peak_extra_bytes"]))
        else:
            need = r.get("needs_bytes") or needs_bytes(r["method"], r["tokens"], r.get("heads", HEADS))
            note = f"needs {_gb(need)}: computed, not measured" if need else r.get("note", r.get("status", ""))
            rows.append(_row("computed", r["method"], r["tokens"], None, need, note))
    for n in sorted(set(sizes)):
        need = needs_bytes("esrt_split", n)
        rows.append(
            _row("computed", "esrt_split", n, None, need, f"score matrices {_gb(need)}: computed, not measured")
        )
    return rows


def committed_sr(results_dir: Path) -> list[list]:
    """Rows of ``sr_scaling.json`` (whole x4 networks, LR tokens = LR pixels), if it was committed."""
    path = Path(results_dir) / "sr_scaling.json"
    if not path.is_file():
        return []
    rows = []
    for r in json.loads(path.read_text()).get("rows", []):
        if r.get("status") == "ok":
            rows.append(_row("committed", r["model"], r["tokens"], r["latency_s"], r["peak_extra_bytes"], r["size"]))
        else:
            note = f"{r['size']}: {r.get('status')} at the {_gb(r.get('limit_bytes', 0))} cap"
            rows.append(_row("committed", r["model"], r["tokens"], None, None, note))
    return rows


def peer_board(results_dir: Path) -> tuple[list[dict], dict] | None:
    """(rows, equal-budget PSNR per network) of the committed peer board (``sr_peers.json``), or None."""
    path = Path(results_dir) / "sr_peers.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data.get("rows", []), {m: tuple(v) for m, v in data.get("ablation_psnr", {}).items()}


def pareto_for(board: tuple[list[dict], dict], arch: str | None):
    """The board's quality-against-speed plot with the network of ``arch`` (a weight card's) marked as chosen."""
    from nala_gen.bench.sr_scaling import BOARD_ARCH, pareto_figure

    rows, psnr = board
    return pareto_figure(rows, psnr, BOARD_ARCH.get(arch or ""))


# ------------------------------------------------------------------------------------------------------ live
def _grid(tokens: int) -> tuple[int, int]:
    """A near-square (h, w) grid with h * w close to ``tokens`` (exact for 256 x 280 = 71,680)."""
    if tokens == 71_680:
        return 256, 280
    h = max(1, math.isqrt(tokens))
    return h, max(1, round(tokens / h))


def _live_fn(method: str, tokens: int):
    import torch

    from nala_gen.attention.registry import method_fn
    from nala_gen.sr.archs.esrt_arch import split_softmax_attention

    if method == "naladit_step":
        from nala_gen.diffusion import NaLaDiTTransformer2DModel

        h, w = _grid(tokens)
        model = NaLaDiTTransformer2DModel.from_size(
            "tiny", sample_size=32, in_channels=3, num_classes=10, learn_sigma=False
        ).eval()
        x = torch.randn(1, 3, 2 * h, 2 * w)
        t, y = torch.tensor([500.0]), torch.tensor([1])
        return lambda: model(x, timestep=t, class_labels=y).sample, h * w
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, tokens, HEAD_DIM) for _ in range(3))
    if method == "esrt_split":
        return lambda: split_softmax_attention(q, k, v, HEAD_DIM**-0.5, ESRT_SPLITS), tokens
    return method_fn(method, q, k, v), tokens  # the benchmark's own calls (SDPA, explicit softmax, linear kernels)


def live_budget() -> int:
    from nala_gen.sr.upscale.engine import available_memory

    return min(LIVE_BUDGET_BYTES, available_memory(__import__("torch").device("cpu")))


def measure_live(method: str, tokens: int, budget: int | None = None) -> list:
    """One row: measured now in this process, or computed where a live run would not fit."""
    import torch

    from nala_gen.profiling import measure

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(LIVE_METHODS)}")
    budget = live_budget() if budget is None else budget
    need = needs_bytes(method, tokens)
    if need is not None and need > budget:
        return _row("computed", method, tokens, None, need, f"needs {_gb(need)}: computed, not measured")
    if method == "softmax_sdpa" and tokens > SDPA_LIVE_MAX_TOKENS:
        note = f"not run live above {SDPA_LIVE_MAX_TOKENS:,} tokens (O(N²) time); see the committed figure"
        return _row("skipped", method, tokens, None, None, note)
    with torch.inference_mode():
        fn, n = _live_fn(method, tokens)
        small = n <= SDPA_LIVE_MAX_TOKENS  # large sizes: one run, so a click stays interactive
        _, m = measure(fn, "cpu", repeats=2 if small else 1, warmup=1 if small else 0)
    runs = "median of 2 runs after a warm-up" if small else "one run"
    return _row("live", method, n, m.latency_s, m.peak_mem_bytes, f"{runs}, {torch.get_num_threads()} CPU threads")


# ------------------------------------------------------------------------------------------------------ plot
def to_frame(rows: list[list]):
    """Rows as a table for the page."""
    import pandas as pd

    rows = sorted(rows, key=lambda r: (r[0] not in ("live", "skipped"), r[2], r[1]))  # this session's runs first
    return pd.DataFrame(rows, columns=COLUMNS)


def plot(rows: list[list], title: str):
    """Latency and peak memory against tokens (log-log): lines for committed runs, stars for live ones,
    hollow squares for computed memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 5), dpi=90)
    methods = list(dict.fromkeys(r[1] for r in rows))
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    for method in methods:
        mine = [r for r in rows if r[1] == method]
        for source, marker, style in (("committed", "o", "-"), ("live", "*", ":")):
            pts = sorted((r[2], r[3], r[4]) for r in mine if r[0] == source and r[3] is not None)
            if pts:
                label = method if source == "committed" else f"{method} (live)"
                ax_t.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=marker, color=colors[method])
                ax_m.plot([p[0] for p in pts], [p[2] for p in pts], style, marker=marker, color=colors[method],
                          label=label)  # fmt: skip
        computed = sorted((r[2], r[4]) for r in mine if r[0] == "computed" and r[4] is not None)
        if computed:
            ax_m.plot([p[0] for p in computed], [p[1] for p in computed], "--", marker="s", mfc="none",
                      color=colors[method], label=f"{method} (computed, not measured)")  # fmt: skip
    ax_t.set_ylabel("latency (s)")
    ax_m.set_ylabel("peak memory above inputs (MiB)")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens N")
        ax.grid(True, which="both", alpha=0.3)
        ax.axvline(71_680, color="gray", lw=0.8, ls=":")
    handles, labels = ax_m.get_legend_handles_labels()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.2 if handles else 0, 1, 1))
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    plt.close(fig)
    return fig
