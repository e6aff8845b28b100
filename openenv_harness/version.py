"""The package version, in one place (recorded in every record's provenance)."""

__version__ = "0.1.0"
