"""BasicSR training with our archs: ``python -m nala_gen.sr.train -opt options/train/NaLaSR/X.yml``.

Registers NaLaSR and ESRT, then runs BasicSR's own ``train_pipeline`` with the current directory as root
(``experiments/``, ``tb_logger/`` go there). All of BasicSR's flags work: ``--auto_resume``, ``--debug``,
``--force_yml key:sub=value``, ``--launcher pytorch`` (multi-GPU: ``torchrun --nproc_per_node=4 -m
nala_gen.sr.train -opt X.yml --launcher pytorch``).

BasicSR 1.4.2 loads a resume state onto CUDA unconditionally, and ``--auto_resume`` takes the highest-numbered
``.state`` even when it is unreadable (a run killed while writing it leaves a truncated file, and every later
resume fails). Here resume states load onto the CPU when CUDA is unavailable, and ``--auto_resume`` takes the newest
state that loads, warning in one line about each one it skips. Checkpoints (``net_g_*.pth``) and training states are
written atomically (a temporary file beside them, then a rename), so a kill mid-write never leaves a truncated one
under the real name. basicsr itself is not edited.
"""

from __future__ import annotations

import os
import sys
import types

import torch

import nala_gen.sr.basicsr  # noqa: F401  (registers the archs and the model in BasicSR's registries)

# basicsr is imported inside functions: it must come after nala_gen.sr, which import sorting cannot keep.


def _load_state(path: str) -> dict:
    location = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    state = torch.load(path, map_location=location, weights_only=True)
    if not isinstance(state, dict) or "iter" not in state:
        raise ValueError("not a BasicSR training state")
    return state


def load_resume_state(opt: dict) -> dict | None:
    """``basicsr.train.load_resume_state``: onto the CPU without CUDA, and past unreadable states."""
    from basicsr.train import check_resume

    if not opt["auto_resume"]:
        path = opt["path"].get("resume_state")
        if not path:
            return None
        state = _load_state(path)
    else:
        state_dir = os.path.join("experiments", opt["name"], "training_states")
        names = os.listdir(state_dir) if os.path.isdir(state_dir) else []
        names = [f for f in names if f.endswith(".state") and f[: -len(".state")].isdigit()]
        state = None
        for name in sorted(names, key=lambda f: int(f[: -len(".state")]), reverse=True):
            path = os.path.join(state_dir, name)
            try:
                state = _load_state(path)
                break
            except Exception as err:  # a truncated or foreign file: take the next newest
                print(f"warning: skipping unreadable training state {path} ({type(err).__name__})", file=sys.stderr)
        if state is None:
            return None
        opt["path"]["resume_state"] = path
    check_resume(opt, state["iter"])
    return state


class _AtomicSaveTorch(types.ModuleType):
    """``torch`` as BasicSR's model code sees it, except that ``save`` to a path is atomic."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def save(obj, f, *args, **kwargs) -> None:
        if not isinstance(f, str | os.PathLike):
            return torch.save(obj, f, *args, **kwargs)
        tmp = f"{os.fspath(f)}.{os.getpid()}.tmp"
        try:
            torch.save(obj, tmp, *args, **kwargs)
            os.replace(tmp, f)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def main() -> None:
    import basicsr.models.base_model as base_model
    import basicsr.train as basicsr_train

    basicsr_train.load_resume_state = load_resume_state
    base_model.torch = _AtomicSaveTorch("torch")  # save_network / save_training_state write through it
    basicsr_train.train_pipeline(os.getcwd())


if __name__ == "__main__":
    sys.exit(main())
