"""The package version (its own module, so that any stage can name it without importing the package root)."""

__version__ = "0.6.0"
