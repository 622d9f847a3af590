"""The wire layer Exactly's services and SDK share: Kafka's record batch v2 codec
(`records`), Kafka's error codes (`error_codes`), and the generated protobuf and gRPC
modules of the `exactly.v1` API (`v1`, generated from protos/ by `make proto`).

Nothing here does I/O; both sides of every RPC import these modules, so the bytes a
producer encodes are the bytes the partition leader validates and stores.
"""

# The PyPI distribution that ships the SDK (import name `exactly`), this package and the
# `exactly` command line; the services are its `server` extra (pyproject.toml).
DISTRIBUTION = "exactly-log"


def version() -> str:
    """The release of this installation, e.g. "0.2.0": the installed distribution's version,
    which pip took from pyproject.toml's `[project] version`, the one place a release is
    written (the image tag, the Helm chart's appVersion, `exactly --version`, the services'
    start-up log line and the `exactly_build_info` series all come from it; CHANGELOG.md
    has an entry per release). Run from a source tree that is not installed, the version
    in that tree's pyproject.toml. Raises nothing; "unknown" when neither exists."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed
    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        import pathlib
        import tomllib
        pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            project = tomllib.loads(pyproject.read_text())["project"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"
        return project["version"] if project.get("name") == DISTRIBUTION else "unknown"
