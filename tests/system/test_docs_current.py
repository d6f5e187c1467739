"""The README's generated blocks are what their code and records say now (scripts/write_docs.py)."""

from __future__ import annotations

import re

from scripts.write_docs import DOCUMENTS, GENERATORS, render


def test_every_generated_block_is_current():
    for doc in DOCUMENTS:
        text = doc.read_text()
        assert render(text) == text, f"{doc.name} is out of date: run python scripts/write_docs.py"


def test_the_readme_holds_every_generated_table():
    names = set(re.findall(r"<!-- generated: ([a-z-]+) -->", DOCUMENTS[0].read_text()))
    assert names == set(GENERATORS)
