"""``nala_gen.sr`` laid out by job: BasicSR users' own scripts work after one import, the pre-layout module paths
are gone (nothing was released with them), and the sub-packages import one way, without circles."""

import ast
import importlib
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import nala_gen.sr

SR_ROOT = Path(nala_gen.sr.__file__).parent


def run_script(source: str) -> subprocess.CompletedProcess:
    """A user's script in a fresh process (nothing of this test session's imports or registrations)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True, timeout=300, cwd=SR_ROOT.parent
    )


def test_basicsr_user_script_after_importing_nala_gen_sr():
    """What a BasicSR user's own code does: our package first, then BasicSR and its modules, by their own names."""
    done = run_script(
        """
        import sys
        import nala_gen.sr
        assert "torchvision" not in sys.modules, "importing nala_gen.sr must stay cheap"
        import basicsr
        from basicsr.archs.srvgg_arch import SRVGGNetCompact
        from basicsr.data.degradations import random_add_gaussian_noise  # imports the removed torchvision module
        net = SRVGGNetCompact(num_conv=2, num_feat=8, upscale=2)
        print("basicsr", basicsr.__version__, type(net).__name__)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "basicsr 1.4.2 SRVGGNetCompact" in done.stdout


def test_one_documented_import_registers_the_archs_and_the_model():
    done = run_script(
        """
        import torch
        import nala_gen.sr.basicsr  # the documented import
        from basicsr.archs import build_network
        from basicsr.utils.registry import ARCH_REGISTRY, MODEL_REGISTRY
        assert {"NaLaSR", "ESRT", "SRVGGNetCompactZeroInit"} <= set(ARCH_REGISTRY._obj_map), ARCH_REGISTRY._obj_map
        assert "UpscalerSRModel" in MODEL_REGISTRY
        net = build_network({"type": "NaLaSR", "upscale": 2, "num_block": 1})
        print(tuple(net(torch.rand(1, 3, 12, 12)).shape))
        """
    )
    assert done.returncode == 0, done.stderr
    assert "(1, 3, 24, 24)" in done.stdout


def test_without_the_alias_basicsr_does_not_import():
    """The alias is what makes the scripts above work (this torchvision really lacks the module)."""
    done = run_script("import basicsr")
    assert done.returncode != 0
    assert "functional_tensor" in done.stderr


def test_the_pre_layout_module_paths_are_gone():
    """They were kept, deprecated, until a release that never came (contributing.md: moving a module)."""
    for old in ("nala_gen.sr.upscaler", "nala_gen.sr.models", "nala_gen.sr.nalasr_arch", "nala_gen.sr.inference_graph"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert not list(SR_ROOT.glob("_moved.py"))


def _sr_imports(path: Path) -> set[str]:
    """The sub-packages of nala_gen.sr that a module imports (relative or absolute, at any depth in the file)."""
    package = ".".join(path.relative_to(SR_ROOT.parent.parent).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + ".__init__"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: -node.level] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if name.startswith("nala_gen.sr."):
                found.add(name.split(".")[2])
    return found


def test_sub_packages_import_one_way():
    """archs <- upscale <- jobs, basicsr; nothing below imports the entry points; no circles between sub-packages."""
    subpackages = sorted(p.name for p in SR_ROOT.iterdir() if (p / "__init__.py").is_file())
    assert {"archs", "basicsr", "upscale", "jobs", "data", "interop"} <= set(subpackages)
    graph = {name: set() for name in subpackages}
    for name in subpackages:
        for module in (SR_ROOT / name).glob("*.py"):
            graph[name] |= {dep for dep in _sr_imports(module) if dep in graph and dep != name}
    assert graph["archs"] == set(), graph
    assert "jobs" not in graph["upscale"] and "basicsr" not in graph["upscale"], graph

    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(dep == goal or (dep not in seen and reaches(dep, goal, seen | {dep})) for dep in graph[start])

    assert not [name for name in graph if reaches(name, name)], graph
    entry_points = {"cli", "demo", "evaluate", "train", "test"}
    for name in subpackages:
        for module in (SR_ROOT / name).glob("*.py"):
            assert not _sr_imports(module) & entry_points, module


REPO = SR_ROOT.parents[1]
SR_OPTION_FILES = sorted((REPO / "options").glob("t*/*/*.yml"))


@pytest.mark.parametrize("option", SR_OPTION_FILES, ids=lambda p: p.stem)
def test_every_sr_option_file_builds_under_the_one_kernel_name(option):
    """Each shipped BasicSR option file names its network's attention ``kernel`` (no deprecated key) and builds."""
    import torch
    import yaml
    from basicsr.archs import build_network  # (BasicSR imports after nala_gen.sr, at the top of this file)

    import nala_gen.sr.basicsr  # noqa: F401  (registers NaLaSR and ESRT)
    from nala_gen.attention import NaLaAttention

    network = yaml.safe_load(option.read_text())["network_g"]
    assert "attn_type" not in network, option
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with torch.device("meta"):  # shapes only: the large configs need no real memory here
            net = build_network(dict(network))
    kernels = {m.kernel for m in net.modules() if isinstance(m, NaLaAttention)}
    assert kernels <= {network.get("kernel", "nala")}, (option, kernels)


def test_every_shipped_sr_card_uses_the_one_kernel_name():
    from nala_gen import weights

    cards = weights.list_weights("sr")
    assert cards
    for card in cards:
        assert "attn_type" not in card.config, card.name
