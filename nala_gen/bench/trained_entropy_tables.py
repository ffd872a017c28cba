"""The docs' table of ``nala-bench trained-entropy``'s result (trained_entropy.json).

Declared apart from :mod:`nala_gen.bench.trained_entropy`, which imports torch, so that rendering the tables
imports none.
"""

from __future__ import annotations

from nala_gen.bench.tables import Table, load


def trained_entropy_table() -> str:
    data = load("trained_entropy.json")
    kernels = list(next(iter(data.values()))["kernels"])
    lines = [
        "Spearman correlation of per-query entropy with query norm, across the model's own queries; in brackets "
        "the mean entropy change (nats) when every query is doubled in length, direction kept. (own) marks the "
        "kernel the model was trained with.",
        "",
        "| model (queries, median norm) | " + " | ".join(kernels) + " |",
        "|---|" + "---|" * len(kernels),
    ]
    for name, res in data.items():
        cells = []
        for k in kernels:
            stats = res["kernels"][k]
            own = " (own)" if k == res["own_kernel"] else ""
            cells.append(f"{stats['spearman']:+.2f} [{stats['entropy_change_at_2x_norm']:+.3f}]{own}")
        lines.append(f"| {name} ({res['queries']:,}, {res['median_norm']:.2f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TABLES = (Table("trained-entropy", ("trained_entropy.json",), trained_entropy_table),)
