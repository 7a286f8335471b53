"""Sources a user can open: what our data and plans cite exists (a doc file, a heading in it), and
nothing cites our own issue tracker, which users cannot see."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "caovan_vllm_sm75_turbo3" / "data"
CITE = re.compile(r"docs/(?P<file>[\w.-]+\.md)(?:#(?P<anchor>[\w-]+))?")


def _anchors(doc: Path) -> set[str]:
    heads = re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}


def _cited_texts() -> list[tuple[str, str]]:
    texts = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(DATA.glob("*.json"))]
    src = ROOT / "src" / "caovan_vllm_sm75_turbo3"
    texts += [(str(p.relative_to(src)), p.read_text(encoding="utf-8")) for p in sorted(src.glob("policy/*.py"))]
    return texts


def test_no_data_or_plan_cites_our_issue_tracker():
    for name, text in _cited_texts():
        assert not re.search(r"\bissue \d+", text), name


def test_every_cited_doc_and_heading_exists():
    seen = 0
    for name, text in _cited_texts():
        for m in CITE.finditer(text):
            doc = ROOT / "docs" / m.group("file")
            assert doc.is_file(), (name, m.group(0))
            if m.group("anchor"):
                assert m.group("anchor") in _anchors(doc), (name, m.group(0))
            seen += 1
    assert seen >= 3
