"""The README and the docs site: results tables generated from the JSON and committed up to date, a short README
whose relative links resolve, results pages that include only tables that exist. (`make test` also builds the
site with `mkdocs build --strict`, which fails on broken links, anchors and missing pages.)"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nala_gen.bench.tables import RESULTS, Table, declared

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
INCLUDE = re.compile(r'^--8<-- "([^"]+)"\s*$', re.MULTILINE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)|(?:src|href)=\"([^\"]+)\"")


@pytest.fixture(scope="module")
def tables():
    """scripts/results_tables.py as a module."""
    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "scripts" / "results_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_committed_tables_match_the_json(tables):
    problems = tables.check(tables.TABLES_DIR, tables.README)
    assert not problems, "\n".join(problems) + "\nrun: python scripts/results_tables.py --write"


def test_check_catches_an_edited_table_and_write_mends_it(tables, tmp_path):
    tables_dir, readme = tmp_path / "tables", tmp_path / "README.md"
    shutil.copytree(tables.TABLES_DIR, tables_dir)
    shutil.copy(README, readme)
    edited = tables_dir / "sr-cost.md"
    edited.write_text(edited.read_text().replace("0.13 s", "0.12 s", 1))
    (tables_dir / "typed-by-hand.md").write_text("| a table nobody generates |\n")
    readme.write_text(readme.read_text().replace(" ms, ", " ms (faster), ", 1))

    problems = tables.check(tables_dir, readme)
    assert any("sr-cost.md: differs" in p for p in problems)
    assert any("typed-by-hand.md: not generated" in p for p in problems)
    assert any("headline table differs" in p for p in problems)
    assert tables.main(["--check", "--tables-dir", str(tables_dir), "--readme", str(readme)]) == 1

    tables.write(tables_dir, readme)
    assert tables.check(tables_dir, readme) == []
    assert readme.read_text() == README.read_text()


def test_check_refuses_a_readme_without_the_markers(tables, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# nala_gen\n")
    assert any("lacks the headline markers" in p for p in tables.check(tables.TABLES_DIR, readme))


def declared_tables() -> list[Table]:
    return [table for module_tables in declared().values() for table in module_tables]


def test_every_table_is_generated_from_files_that_exist():
    for table in declared_tables():
        if table.optional:  # the gpu table says so when the CUDA results are absent
            continue
        for source in (*table.sources, *table.reads):
            assert (RESULTS / source).is_file(), f"{table.slug}: {source} missing"


def test_every_result_a_table_reads_is_declared_by_one_module():
    owners, read = {}, set()
    for module, module_tables in declared().items():
        for table in module_tables:
            read.update(table.sources, table.reads)
            for source in table.sources:
                owners.setdefault(source, set()).add(module)
    for source in sorted(read):
        assert len(owners.get(source, ())) == 1, f"{source}: declared by {sorted(owners.get(source, ()))}"


def test_the_script_renders_only_what_the_modules_declare(tables):
    slugs = [table.slug for table in declared_tables()]
    assert len(slugs) == len(set(slugs)), "two tables share a file"
    assert set(slugs) == {p.stem for p in tables.TABLES_DIR.glob("*.md")}
    own = {name for name, value in vars(tables).items() if getattr(value, "__module__", None) == tables.__name__}
    assert own == {"pages", "readme_with_headline", "write", "check", "main"}, "declare tables beside their JSON"


def test_rendering_every_table_imports_no_torch():
    code = (
        "import sys\n"
        "from nala_gen.bench.tables import declared\n"
        "[table.render() for tables in declared().values() for table in tables]\n"
        "assert 'torch' not in sys.modules, 'a module declaring tables imports torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_readme_is_short_and_its_relative_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    targets = [a or b for a, b in LINK.findall(text)]
    assert targets, "no links found: the pattern is broken"
    for target in targets:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (README.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"README links to {target}, which does not exist"


def test_results_pages_include_existing_tables_and_use_every_table(tables):
    included = set()
    for page in DOCS.rglob("*.md"):
        if tables.TABLES_DIR in page.parents:
            continue
        for target in INCLUDE.findall(page.read_text()):
            assert (DOCS / target).is_file(), f"{page.relative_to(ROOT)} includes {target}, which does not exist"
            included.add((DOCS / target).resolve())
    generated = {(tables.TABLES_DIR / f"{t.slug}.md").resolve() for t in declared_tables()}
    unused = sorted(p.name for p in generated - included)
    assert not unused, f"generated tables no page includes: {unused}"


def test_site_fetches_nothing_at_build_time():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["font"] is False  # mkdocs-material would link Google Fonts
    assert config["strict"] is True
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}
    assert plugins <= {"search", "mkdocstrings"}, plugins
