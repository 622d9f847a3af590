"""The upgrade tests' earlier release (exactly_tools.releases)."""
from exactly_tools.releases import Release, ReleaseInstallError, install

__all__ = ["Release", "ReleaseInstallError", "install"]
