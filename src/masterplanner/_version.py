"""The package version, read by the build backend."""

__version__ = "0.1.0"
