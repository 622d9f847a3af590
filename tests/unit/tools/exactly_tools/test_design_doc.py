"""The design's generated parts match the tree: its contents (docs/design.md) name every page
of docs/design/ and its sections, the module map page every module (exactly_tools.design_docs)."""
import pathlib

import pytest

from exactly_tools import design_docs

def test_design_doc_and_module_map_are_up_to_date():
    assert design_docs.main(["--check"]) == 0, "run: python -m exactly_tools.design_docs"


def test_module_map_names_every_module():
    text = design_docs.MAP_PAGE.read_text()
    mapped = design_docs.modules()
    assert len(mapped) > 100
    for rel in mapped:
        assert f"#### `{rel.parent}/`" in text and f"| `{rel.name}` |" in text, rel


def test_a_new_module_makes_the_map_drift(tmp_path: pathlib.Path):
    for package in design_docs.PACKAGES:
        (tmp_path / package).mkdir(parents=True)
    (tmp_path / "services" / "fresh.py").write_text('"""A module the map does not list yet. More."""\n')
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "docs" / "design" / "one.md").write_text("# One\n\n## Sub `x`\n\n### Deeper\n\n## One\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nx: !!python/name:os.getcwd\n"
                                         "nav:\n  - Home: index.md\n  - Design:\n"
                                         "      - Overview: design.md\n      - One: design/one.md\n")
    text = "<!-- toc -->\n<!-- /toc -->\n<!-- module-map -->\n<!-- /module-map -->\n"
    out = design_docs.render(text, tmp_path)
    assert "- [One](design/one.md)\n  - [Sub x](design/one.md#sub-x)\n  - [One](design/one.md#one-1)\n" in out
    assert "#### `services/`" in out and "| `fresh.py` | A module the map does not list yet. |" in out
    (tmp_path / "services" / "bare.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="bare.py"):
        design_docs.render(text, tmp_path)


def test_a_page_without_its_markers_is_an_error(tmp_path: pathlib.Path):
    page = tmp_path / "modules.md"
    page.write_text("# Module map\n")
    with pytest.raises(ValueError, match="module-map"):
        design_docs.require_blocks({page: "module-map"})


def test_anchors_follow_github():
    seen: dict[str, int] = {}
    assert design_docs.anchor("Prepare → append → complete", seen) == "prepare--append--complete"
    assert design_docs.anchor("The client's `Sender`", seen) == "the-clients-sender"
    assert design_docs.anchor("Offsets", seen) == "offsets"
    assert design_docs.anchor("Offsets", seen) == "offsets-1"
