"""nala_gen inside BasicSR 1.4.2: ``import nala_gen.sr.basicsr`` is the one import a BasicSR user's script needs.

It registers NaLaSR, ESRT and SRVGGNetCompactZeroInit in BasicSR's ``ARCH_REGISTRY`` and
:class:`~nala_gen.sr.basicsr.model.UpscalerSRModel` in its ``MODEL_REGISTRY`` (:mod:`.registry`), and lets
``torch.load(weights_only=True)`` (torch's default) read BasicSR's training states, whose schedulers keep their
milestones in a ``collections.Counter``. After it, BasicSR's option files can name ``type: NaLaSR`` /
``type: ESRT`` and ``model_type: UpscalerSRModel``::

    import nala_gen.sr.basicsr  # noqa: F401
    from basicsr.archs import build_network
    net = build_network({"type": "NaLaSR", "upscale": 4})

``python -m nala_gen.sr.train -opt X.yml`` / ``python -m nala_gen.sr.test -opt X.yml`` are BasicSR's own entry
points with this import done first.
"""

import collections

import torch

from .registry import ARCH_REGISTRY, MODEL_REGISTRY  # noqa: F401  (importing registers)

torch.serialization.add_safe_globals([collections.Counter])
