"""Every code block of the README and of the site declares what it is (tests/docs/codeblocks.py),
and every page with a block to run has a test module that runs it (tests/docs/examples.py)."""
from __future__ import annotations

import os

import pytest

from docs.codeblocks import Block, blocks, pages, parse, problems
from docs.examples import RUN_BY, _started, helm_commands, run
from waiting import wait_for


def test_every_block_says_what_it_is():
    bad = [f"{b.id}: {p}" for page in pages() for b in blocks(page) for p in problems(b)]
    assert not bad, "\n".join(bad)


def test_every_page_with_a_block_to_run_is_run_by_a_test_module():
    runnable = {page for page in pages() if any(b.kind in ("python", "bash", "file", "helm") for b in blocks(page))}
    assert runnable - set(RUN_BY) == set(), f"pages nobody runs: {runnable - set(RUN_BY)}"
    assert set(RUN_BY) <= set(pages())


def test_fences_marks_and_headings_are_read():
    text = ('# Page\n\n## Copy\n\n```python title="billing.py"\nprint(1)\n```\n\n'
            '```bash no-run="needs a Kubernetes cluster"\nhelm install x\n```\n\n'
            '- item\n\n    ```text\n    output\n    ```\n\n```yaml\na: 1\n```\n')
    found = parse(text, "p.md")
    assert [(b.lang, b.heading, b.line) for b in found] == [
        ("python", "Copy", 5), ("bash", "Copy", 9), ("text", "Copy", 15), ("yaml", "Copy", 19)]
    assert [b.kind for b in found[:3]] == ["file", "no-run", "text"]
    assert found[0].title == "billing.py" and found[0].text == "print(1)\n"
    assert found[1].no_run == "needs a Kubernetes cluster"
    assert found[2].text == "output\n"
    assert problems(found[3]) == ["language 'yaml' is neither run nor text: mark it no-run=\"why\""]
    assert problems(parse('```bash no-run\nx\n```\n', "p.md")[0])
    assert problems(parse('```\nx\n```\n', "p.md")[0])


def test_transactional_blocks_are_recognised():
    txn, plain = parse('```python\nProducer({"transactional.id": "a"})\n```\n```python\nprint(1)\n```\n', "p.md")
    assert txn.transactional and not plain.transactional


def test_helm_commands_are_read_with_their_values():
    block = parse('```bash check="helm template"\ndocker build .\n'
                  'helm install exactly deploy/helm/exactly -n streams --create-namespace \\\n'
                  '  --set image.repository=r.example.com/exactly,metrics.enabled=false\n'
                  'helm test exactly -n streams\n'
                  'helm upgrade exactly deploy/helm/exactly -n streams --reuse-values --set partitionLeaders.replicas=5\n'
                  '```\n', "p.md")[0]
    assert block.kind == "helm"
    (n1, chart, ns, v1), (n2, _, _, v2) = helm_commands(block)
    assert (n1, chart.name, ns) == ("exactly", "exactly", "streams") and n2 == "exactly"
    assert v1 == {"image": {"repository": "r.example.com/exactly"}, "metrics": {"enabled": False}}
    assert v2 == {**v1, "partitionLeaders": {"replicas": 5}}


def test_the_readmes_blocks_to_run_are_the_quick_start():
    """tests/docs/test_quickstart.py runs the README's section "Quick start"; a block to run
    anywhere else in the README would run nowhere."""
    elsewhere = [b.id for b in blocks("README.md") if b.kind not in ("text", "no-run") and b.heading != "Quick start"]
    assert not elsewhere, f"README blocks outside the quick start: {elsewhere}"



def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_failed_block_leaves_nothing_of_its_process_group_running(tmp_path):
    """A block whose own process exits while a child it started runs on (a Spark driver that
    failed, its JVM still up) leaves nothing behind: run() and _started SIGKILL the group."""
    failing = Block("docs/x.md", 1, "bash", {}, "sleep 300 > /dev/null 2>&1 & echo $! > failed.pid; exit 3\n", "x")
    with pytest.raises(AssertionError, match="exited 3"):
        run(failing, tmp_path, dict(os.environ))
    started = Block("docs/x.md", 2, "bash", {}, "sleep 300 > /dev/null 2>&1 & echo $! > started.pid; exit 0\n", "x")
    with _started(started, tmp_path, dict(os.environ), tmp_path / "started.log") as proc:
        proc.wait(30)
        assert _running(int((tmp_path / "started.pid").read_text()))
    for name in ("failed.pid", "started.pid"):
        pid = int((tmp_path / name).read_text())
        wait_for(lambda: not _running(pid), 10, f"{name}: the block's child {pid} to be killed")
