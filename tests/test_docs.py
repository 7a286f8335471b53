"""The README stays a short user page, and the docs it points into stay whole.

Plain pathlib and re only (no vLLM, torch or tomllib: Python 3.10 has no tomllib), so these run
in every test lane.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_BYTES = 12_288
# [text](target): the target up to the closing parenthesis, without spaces.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"docs/[A-Za-z0-9_./-]+?\.md")


def _pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "src/caovan_vllm_sm75_turbo3/kernels/README.md"]


def _relative_links(page: Path) -> list[str]:
    """Link targets that point into this repository (no scheme, no bare #anchor)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def _project_scripts() -> list[str]:
    """The command names of pyproject.toml's [project.scripts] table."""
    text = (ROOT / "pyproject.toml").read_text()
    table = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    assert table, "pyproject.toml has no [project.scripts] table"
    return re.findall(r'^([A-Za-z0-9_.-]+)\s*=\s*"', table.group(1), re.M)


def test_readme_is_a_short_user_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move reference material into docs/"


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for target in _relative_links(page):
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_link_check_sees_links():
    # Guards the regex: a README without any resolvable link would pass the test above vacuously.
    assert "docs/serve.md" in _relative_links(README)
    assert "../benchmarks/RESULTS.md" in _relative_links(ROOT / "docs" / "turbo.md")


def test_every_command_is_in_the_readme_commands_table():
    readme = README.read_text()
    section = re.search(r"^## Commands\n(.*?)(?=^## )", readme, re.M | re.S)
    assert section, "README.md lost its Commands section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("| `")]
    listed = {re.match(r"\| `([^` ]+)", row).group(1) for row in rows}
    scripts = _project_scripts()
    assert len(scripts) >= 6
    assert set(scripts) - listed == set()


def test_every_docs_page_named_in_code_or_readme_exists():
    sources = [README, *(p for ext in ("py", "md", "json") for p in sorted((ROOT / "src").rglob(f"*.{ext}")))]
    missing = set()
    for source in sources:
        for name in DOC_PATH.findall(source.read_text()):
            if not (ROOT / name).is_file():
                missing.add(f"{source.relative_to(ROOT)}: {name}")
    assert missing == set()
