"""The one error the assembler raises.

Why a dedicated type: a trainer must be able to tell "this capture cannot be assembled faithfully"
(fail the rollout, keep training) from a programming error (stop). ``AssemblyError`` subclasses
``ValueError`` so code that already treats malformed captures as ``ValueError`` keeps working.
"""

from __future__ import annotations


class AssemblyError(ValueError):
    """A record or a trace breaks the token contract; the message names the record and the rule."""
