"""huggingface_hub's model mixin on the SR archs, its module imported on first use.

``PyTorchModelHubMixin`` gives a network ``save_pretrained(folder)`` (``config.json`` + ``model.safetensors`` + a
model card), ``Cls.from_pretrained(folder_or_repo)`` and ``push_to_hub``. Its module imports huggingface_hub's
HTTP client and Hub API when it loads (about 0.15 s on this project's CPU), a cost every one-image ``nala-sr
upscale`` paid when the archs derived from it directly. The archs derive from :class:`HubMixin` instead: it records
the constructor's arguments as the mixin does (``_hub_mixin_config``: defaults plus the arguments given, JSON
values only), and its three methods run the mixin's own code through a twin class, ``(PyTorchModelHubMixin,
Arch)``, built on the first call. What they return is the arch's own class.
"""

from __future__ import annotations

import inspect
import json
from typing import Any


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class HubMixin:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` of huggingface_hub's ``PyTorchModelHubMixin``.

    Subclass keywords: ``hub_tags`` (the model card's tags; ``library_name`` is ``nala_gen``).
    """

    _hub_tags: tuple[str, ...] = ()

    def __init_subclass__(cls, *, hub_tags: tuple[str, ...] | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if hub_tags is not None:
            cls._hub_tags = tuple(hub_tags)

    def __new__(cls, *args, **kwargs):
        instance = super().__new__(cls)
        if hasattr(cls, "_hub_mixin_info"):  # the twin: huggingface_hub's own __new__ records the config
            return instance
        bound = inspect.signature(cls.__init__).bind(instance, *args, **kwargs)
        bound.apply_defaults()
        arguments = list(bound.arguments.items())[1:]  # without self
        instance._hub_mixin_config = {name: value for name, value in arguments if _jsonable(value)}
        return instance

    @classmethod
    def _hub_twin(cls) -> type:
        """This class with huggingface_hub's mixin first in its MRO (made once per class)."""
        twin = cls.__dict__.get("_hub_twin_class")
        if twin is None:
            from huggingface_hub import PyTorchModelHubMixin

            namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
            twin = type(cls.__name__, (PyTorchModelHubMixin, cls), namespace, library_name="nala_gen",
                        tags=list(cls._hub_tags))  # fmt: skip
            cls._hub_twin_class = twin
        return twin

    def _as_hub(self):
        """A view of this network as its twin: the same modules, parameters and config (nothing copied)."""
        view = object.__new__(type(self)._hub_twin())
        view.__dict__.update(self.__dict__)
        return view

    def save_pretrained(self, save_directory, **kwargs):
        """huggingface_hub's ``save_pretrained``: ``config.json``, ``model.safetensors`` and a model card."""
        return self._as_hub().save_pretrained(save_directory, **kwargs)

    def push_to_hub(self, repo_id: str, **kwargs):
        """huggingface_hub's ``push_to_hub`` (needs the network and a token)."""
        return self._as_hub().push_to_hub(repo_id, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """huggingface_hub's ``from_pretrained``: a local folder (offline) or a Hub repository."""
        model = cls._hub_twin().from_pretrained(pretrained_model_name_or_path, **kwargs)
        model.__class__ = cls  # the twin adds methods only: the arch's own class, as if built by ``cls(**config)``
        return model
