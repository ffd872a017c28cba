"""Which code paths the CPU kernels take: one value, read from the environment once.

The environment variables are the user's interface (set before the process starts):

| variable | field | default |
|---|---|---|
| ``NALA_GEN_FUSED=0`` | ``fused``: the fused NaLa op runs where it can | on |
| ``NALA_GEN_FUSED_ISA=avx2`` or ``baseline`` | ``fused_isa``: caps the op's instruction set | the widest the CPU runs |
| ``NALA_GEN_WINOGRAD=0`` | ``winograd``: the Winograd 3x3 and the 1x1 kernels | on |
| ``NALA_GEN_WINOGRAD_ISA=avx2`` | ``winograd_isa``: caps those kernels' instruction set | the widest the CPU runs |
| ``NALA_GEN_CONV_CHOICE=static`` | ``conv_choice``: how the fast SR form picks each convolution's kernel | ``probe`` |
| ``NALA_GEN_COMPILE=1`` | ``compile``: the PyTorch path's feature map by ``torch.compile`` | off |

Why one value: code that chooses a path takes it as an argument (its default is :func:`runtime_options`), so a
process runs one configuration from start to end, the probe cache can hash exactly what changes a pass, and a test
or a benchmark switches a path with :func:`using` instead of writing to ``os.environ`` while code reads it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

ISAS = ("avx512", "avx2", "baseline")  # widest first
CONV_CHOICES = ("probe", "static")
_OFF = ("0", "false", "no")
_ON = ("1", "true", "yes")


@dataclass(frozen=True)
class RuntimeOptions:
    """The CPU kernels' switches (see the module).

    fused: the fused NaLa op runs where it applies (off: the PyTorch path everywhere).
    fused_isa: the widest instruction set the fused op may use (``avx512``, ``avx2``, ``baseline``); None for the
        widest this CPU runs.
    winograd: the Winograd 3x3 and the 1x1 convolution kernels run where they apply.
    winograd_isa: the widest instruction set those kernels may use (``avx512``, ``avx2``; ``baseline``: none of
        them, the direct convolution everywhere); None for the widest this CPU runs. To test or time the AVX2
        kernels on a CPU with AVX-512.
    compile: ``linear_attention``'s PyTorch path fuses its feature map with ``torch.compile`` when the caller does
        not say.
    conv_choice: ``probe``: the SR networks' fast form runs each convolution shape by whichever kernel timed
        fastest on this machine (timed once, kept in a cache: ``nala_gen.sr.archs.fast.conv_choice``);
        ``static``: by the fixed rule (Winograd F(4x4, 3x3) for 16 and 32 input channels, F(2x2, 3x3) for the
        others, the 1x1 kernel where it applies), which never times anything. The test suite runs ``static``.
    """

    fused: bool = True
    fused_isa: str | None = None
    winograd: bool = True
    compile: bool = False
    winograd_isa: str | None = None
    conv_choice: str = "probe"

    def __post_init__(self) -> None:
        for name in ("fused_isa", "winograd_isa"):
            if getattr(self, name) is not None and getattr(self, name) not in ISAS:
                raise ValueError(f"{name} must be one of {ISAS} or None, not {getattr(self, name)!r}")
        if self.conv_choice not in CONV_CHOICES:
            raise ValueError(f"conv_choice must be one of {CONV_CHOICES}, not {self.conv_choice!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def from_environ(environ: Mapping[str, str] | None = None) -> RuntimeOptions:
    """The options the variables of ``environ`` (``os.environ`` by default) set; unset ones keep their default."""
    env = os.environ if environ is None else environ
    isa, winograd_isa = (env.get(f"NALA_GEN_{n}", "").strip().lower() for n in ("FUSED_ISA", "WINOGRAD_ISA"))
    choice = env.get("NALA_GEN_CONV_CHOICE", "").strip().lower()
    return RuntimeOptions(
        fused=env.get("NALA_GEN_FUSED", "1").strip().lower() not in _OFF,
        # an unknown name caps nothing (the C++ op used to fall back to its baseline kernels for one: a typo then
        # cost the vector kernels without a word)
        fused_isa=isa if isa in ISAS else None,
        winograd=env.get("NALA_GEN_WINOGRAD", "1").strip().lower() not in _OFF,
        compile=env.get("NALA_GEN_COMPILE", "0").strip().lower() in _ON,
        winograd_isa=winograd_isa if winograd_isa in ISAS else None,
        # likewise an unknown value keeps the default
        conv_choice=choice if choice in CONV_CHOICES else "probe",
    )


# Plain module state rather than a ContextVar or functools.cache: torch.compile traces through runtime_options()
# (linear_attention, the Winograd check) and reads a global as a constant.
_environ: RuntimeOptions | None = None
_chosen: list[RuntimeOptions] = []  # the :func:`using` blocks open now, innermost last


def runtime_options() -> RuntimeOptions:
    """The options in force: those of the innermost :func:`using`, else the environment's (read at the first call)."""
    global _environ
    if _chosen:
        return _chosen[-1]
    if _environ is None:
        _environ = from_environ()
    return _environ


@contextmanager
def using(options: RuntimeOptions | None = None, **changes) -> Iterator[RuntimeOptions]:
    """Run the block with ``options`` (the ones in force by default) with ``changes`` applied, e.g.
    ``with using(fused=False): ...``; yields the options in force inside. Process-wide (tests, benchmarks): a
    thread started inside the block sees them too."""
    chosen = replace(options or runtime_options(), **changes)
    _chosen.append(chosen)
    try:
        yield chosen
    finally:
        _chosen.pop()
