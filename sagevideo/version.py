"""The package version, importable without the package's lazy public surface."""

__version__ = "0.1.0"
