"""deploy/docker/Dockerfile, read: these checks keep it consistent with the repository and
the chart (sources it copies exist, user matches the chart's). test_image.py builds it and
runs the services from it."""
from __future__ import annotations

import pathlib
import re

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_image_is_python_311_slim_or_the_base_given_and_installs_the_project_with_the_server_extras():
    # BASE: python:3.11-slim unless the build names another (make image: a Debian made here).
    ins = instructions()
    assert ins[0] == ("ARG", "BASE=python:3.11-slim")
    stages = [rest for word, rest in ins if word == "FROM"]
    assert stages == ["${BASE} AS build", "${BASE}"]
    # The services import the server extras (kazoo, rocksdict, prometheus-client, kio,
    # uvloop, ...): the SDK's wheel alone gives the SDK only. The final stage installs the
    # wheel with them, from what is already installed (no index).
    final = ins[[i for i, (word, _) in enumerate(ins) if word == "FROM"][-1]:]
    runs = " ".join(rest for word, rest in final if word == "RUN")
    assert 'pip install --no-index "$(ls /tmp/wheels/exactly_log-*.whl)[server]"' in runs
    assert "pip check" in runs
    # The dependencies installed are the ones pyproject.toml lists for the SDK and the server extra.
    build = " ".join(rest for word, rest in ins[:len(ins) - len(final)] if word == "RUN")
    assert 'p["dependencies"] + p["optional-dependencies"]["server"]' in build


def test_copied_sources_exist_and_are_kept_by_the_dockerignore():
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from="):
            *sources, _ = rest.split()
            for src in sources:
                assert (REPO / src).exists(), src
                assert f"!{src}" in ignore or f"!{src}/**" in ignore, src


def test_image_runs_as_the_non_root_user_of_the_chart():
    ins = instructions()
    users = [rest for word, rest in ins if word == "USER"]
    assert users == ["10001:10001"]
    assert [w for w, _ in ins].index("USER") > max(i for i, (w, _) in enumerate(ins) if w == "RUN")
    values = yaml.safe_load((REPO / "deploy" / "helm" / "exactly" / "values.yaml").read_text())
    assert values["securityContext"]["runAsUser"] == values["podSecurityContext"]["runAsUser"] == 10001
    assert values["podSecurityContext"]["fsGroup"] == 10001
