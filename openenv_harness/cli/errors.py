"""User-facing errors of the CLI."""

from __future__ import annotations


class CLIError(Exception):
    """Printed as one line plus a hint; never a traceback unless ``--debug``."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint
