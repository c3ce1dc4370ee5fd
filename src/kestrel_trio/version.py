"""The package's version, in one place below every layer (the CLI's --version reads it too)."""

__version__ = "0.1.0"
