"""One session: what a trainer asks for (``spec.py``), its live state and the parts it owns
(``live.py``: call numbers, the retry window, the budget ledger, and the chain observer in
``recorder/chain/``), the registry that creates, finds, stops and closes sessions (``registry.py``), and
the rebuild of a recovered session's state from its records (``session/restore.py``). The package imports
nothing here."""
