"""BasicSR testing with our archs: ``python -m nala_gen.sr.test -opt options/test/NaLaSR/X.yml``.

Registers NaLaSR and ESRT, then runs BasicSR's own ``test_pipeline`` with the current directory as root
(``results/<name>/`` gets the images and the metric log). Before that, the option file's test sets and weights are
checked to exist: a missing one is one line naming the folder (or file) and the command that makes it, exit 1, not a
traceback from inside BasicSR's data loader.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nala_gen.sr.basicsr  # noqa: F401  (registers the archs and the model in BasicSR's registries)

PREPARE_SETS = "nala-sr prepare benchmarks SRC (a folder of the sets' HR images, e.g. ../shared/datasets/benchmark)"


def missing_inputs(option: str | Path) -> str | None:
    """What the option file's test needs and is not there (test set folders, the network's weights), said in one
    line with the command that makes it; None when all is there."""
    import yaml

    opt = yaml.safe_load(Path(option).read_text())
    for dataset in (opt.get("datasets") or {}).values():
        for key in ("dataroot_gt", "dataroot_lq"):
            folder = dataset.get(key)
            if folder and not Path(folder).is_dir():
                made_by = PREPARE_SETS if "/GTmod12" in folder or "/LRbicx" in folder else "nala-sr prepare"
                return f"{folder} not found (test set {dataset.get('name', '?')}): make it with {made_by}"
    weights = (opt.get("path") or {}).get("pretrain_network_g")
    if weights and not Path(weights).is_file():
        return (
            f"{weights} not found: train the network first (python -m nala_gen.sr.train -opt ...) or point "
            "path: pretrain_network_g at its weights"
        )
    return None


def main() -> int:
    import basicsr.test as basicsr_test  # after nala_gen.sr, which import sorting cannot keep

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-opt")
    known, _ = parser.parse_known_args()
    if known.opt and os.path.isfile(known.opt):
        problem = missing_inputs(known.opt)
        if problem:
            print(f"nala_gen.sr.test: error: {problem}", file=sys.stderr)
            return 1
    basicsr_test.test_pipeline(os.getcwd())
    return 0


if __name__ == "__main__":
    sys.exit(main())
