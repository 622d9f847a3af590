"""docs/design.md's generated parts match the tree: the table of contents names every
section and the module map every module (exactly_tools.design_docs)."""
import pathlib

import pytest

from exactly_tools import design_docs

DESIGN = design_docs.ROOT / "docs" / "design.md"


def test_design_doc_is_up_to_date():
    text = DESIGN.read_text()
    assert design_docs.render(text) == text, "run: python -m exactly_tools.design_docs"


def test_module_map_names_every_module():
    text = DESIGN.read_text()
    mapped = design_docs.modules()
    assert len(mapped) > 100
    for rel in mapped:
        assert f"#### `{rel.parent}/`" in text and f"| `{rel.name}` |" in text, rel


def test_a_new_module_makes_the_map_drift(tmp_path: pathlib.Path):
    for package in design_docs.PACKAGES:
        (tmp_path / package).mkdir(parents=True)
    (tmp_path / "services" / "fresh.py").write_text('"""A module the map does not list yet. More."""\n')
    text = "<!-- toc -->\n<!-- /toc -->\n## One\n<!-- module-map -->\n<!-- /module-map -->\n"
    out = design_docs.render(text, tmp_path)
    assert "- [One](#one)" in out
    assert "#### `services/`" in out and "| `fresh.py` | A module the map does not list yet. |" in out
    (tmp_path / "services" / "bare.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="bare.py"):
        design_docs.render(text, tmp_path)


def test_anchors_follow_github():
    seen: dict[str, int] = {}
    assert design_docs.anchor("Prepare → append → complete", seen) == "prepare--append--complete"
    assert design_docs.anchor("The client's `Sender`", seen) == "the-clients-sender"
    assert design_docs.anchor("Offsets", seen) == "offsets"
    assert design_docs.anchor("Offsets", seen) == "offsets-1"
