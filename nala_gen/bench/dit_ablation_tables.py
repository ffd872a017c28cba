"""The docs' tables of ``nala-bench dit-ablation``'s results (dit_ablation[_<budget>].json).

Declared apart from :mod:`nala_gen.bench.dit_ablation`, which imports torch, so that rendering the tables
imports none.
"""

from __future__ import annotations

from nala_gen.bench.tables import Table, load, row


def dit_ablation_table(name: str = "dit_ablation.json") -> str:
    data = load(name)
    q = data["quality"]
    lines = [
        f"NaLaDiT on the embedded digits, {data['budget']['steps']} steps per run from the `naladit_digits*.yml` "
        f"configs (only `seed`, `output_dir`, the budget and the variant's model fields overridden); "
        f"`nala-gen quality`: {q['per_class']} samples per class, {q['steps']} steps, guidance {q['cfg']:g}; "
        "accuracy by the CNN judge and by the independent SVC judge, Fréchet distance of the CNN's features; "
        f"mean ± sample standard deviation over the seeds (n: the runs scored, where fewer than the seeds); Δ "
        f"against `{data['reference']}` with its standard error (* beyond two).",
        "",
        "| variant | model change against the reference | seeds | accuracy (CNN) | accuracy (SVC) | Fréchet distance "
        "| Δ accuracy (CNN) | Δ accuracy (SVC) | Δ Fréchet distance |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(e, metric, digits):
        if e.get(metric) is None:
            return "not scored"
        spread = f" ± {e[metric + '_std']:.{digits}f}" if e.get(metric + "_std") is not None else ""
        n = e.get(metric + "_n", len(e["seeds"]))
        return f"{e[metric]:.{digits}f}{spread}" + (f" (n {n})" if n < len(e["seeds"]) else "")

    def delta(e, metric, digits):
        if metric + "_vs_reference" not in e:
            return ""
        star = "*" if e[metric + "_beyond_two_se"] else ""
        return f"{e[metric + '_vs_reference']:+.{digits}f} ± {e[metric + '_vs_reference_se']:.{digits}f}{star}"

    for e in data["variants"]:
        change = ", ".join(f"{k}: {v}" for k, v in e["change"].items()) or "(the reference)"
        lines.append(
            row(e["variant"], change, len(e["seeds"]), cell(e, "accuracy", 3), cell(e, "svc_accuracy", 3),
                cell(e, "frechet_distance", 1), delta(e, "accuracy", 3), delta(e, "svc_accuracy", 3),
                delta(e, "frechet_distance", 1))
        )  # fmt: skip
    return "\n".join(lines)


TABLES = (
    Table("dit-ablation", ("dit_ablation.json",), dit_ablation_table),
    Table("dit-ablation-parts", ("dit_ablation_3000st.json",), lambda: dit_ablation_table("dit_ablation_3000st.json")),
)
