"""Make basicsr 1.4.2 importable with current torchvision. Imported by ``nala_gen.sr`` before basicsr.

basicsr 1.4.2 (the PyPI release) imports ``torchvision.transforms.functional_tensor``, a module torchvision
removed in 0.17; the function it needs (``rgb_to_grayscale``) lives in ``torchvision.transforms.functional``.
This is the only place the alias is made.
"""

import collections
import sys

import torch
import torchvision.transforms.functional as _tv_functional

sys.modules.setdefault("torchvision.transforms.functional_tensor", _tv_functional)

# BasicSR's training states hold the LR schedulers' milestones as a Counter; allow it for the
# weights_only=True loads that torch 2.6+ does by default (no arbitrary unpickling).
torch.serialization.add_safe_globals([collections.Counter])
