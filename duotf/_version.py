"""duotf's version (its own module, so any layer can read it without importing the package)."""

__version__ = "0.1.0"
