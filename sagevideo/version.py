"""The package version, importable without the package's lazy public surface, and the installed
versions of the packages it runs on."""

from __future__ import annotations

__version__ = "0.1.0"


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions from package metadata, None for a package not installed (nothing is imported)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
