"""One agent call, from the socket to the stored record and the bytes sent back.

``flow.py`` is the call as plain data; ``pipeline.py`` runs the named steps in order, and turns every
failure into the agent's answer in one place. The steps live in one module per phase: ``admit.py``
(authenticate to dedupe), ``forward.py`` (forward, validate, tool caps), ``record.py`` (the record, its
commit and after-commit hooks; its builder in ``pending.py``):

    authenticate → enter → parse → enforce_budget → dedupe → forward → validate
    → tool_caps → record → reply

Steps see the recorder through ``services.py`` (never its session registry: a step that stops the
session sets ``Flow.stop``, and the pipeline applies it). The package's ``__init__`` imports nothing:
the steps import the flow, never each other's callers.
"""
