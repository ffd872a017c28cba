"""BasicSR training with our archs: ``python -m nala_gen.sr.train -opt options/train/NaLaSR/X.yml``.

Registers NaLaSR and ESRT, then runs BasicSR's own ``train_pipeline`` with the current directory as root
(``experiments/``, ``tb_logger/`` go there). All of BasicSR's flags work: ``--auto_resume``, ``--debug``,
``--force_yml key:sub=value``, ``--launcher pytorch`` (multi-GPU: ``torchrun --nproc_per_node=4 -m
nala_gen.sr.train -opt X.yml --launcher pytorch``).

BasicSR 1.4.2 loads a resume state onto CUDA unconditionally; on a machine without CUDA we load it onto the
CPU instead (``--auto_resume`` and ``path: resume_state`` both go through this), without editing basicsr.
"""

from __future__ import annotations

import os
import sys

import torch

import nala_gen.sr  # noqa: F401  (registers the archs, aliases torchvision for basicsr)

# basicsr is imported inside functions: it must come after nala_gen.sr, which import sorting cannot keep.


def load_resume_state(opt: dict) -> dict | None:
    """``basicsr.train.load_resume_state``, but onto the CPU when CUDA is unavailable."""
    from basicsr.train import check_resume

    path = None
    if opt["auto_resume"]:
        state_dir = os.path.join("experiments", opt["name"], "training_states")
        states = [f for f in os.listdir(state_dir) if f.endswith(".state")] if os.path.isdir(state_dir) else []
        if states:
            latest = max(int(float(f[: -len(".state")])) for f in states)
            path = os.path.join(state_dir, f"{latest}.state")
            opt["path"]["resume_state"] = path
    else:
        path = opt["path"].get("resume_state")
    if not path:
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    check_resume(opt, state["iter"])
    return state


def main() -> None:
    import basicsr.train as basicsr_train

    if not torch.cuda.is_available():
        basicsr_train.load_resume_state = load_resume_state
    basicsr_train.train_pipeline(os.getcwd())


if __name__ == "__main__":
    sys.exit(main())
