"""How a session's agent calls form chains: each call's prompt against the last prompt and sampled
completion of each chain tip (``fidelity.py``: exact, replay drift or break), why a call departs
(``drift_cause.py``), the byte-prefix and block-sketch comparisons both use (``prefix.py``), and the
one owner of a session's chain state (``observer.py``). The package imports nothing here."""
