"""The package version, in the one place the rest of the package reads it from."""

__version__ = "0.1.0"
