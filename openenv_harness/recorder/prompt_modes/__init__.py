"""How a session's calls are sampled: its prompt mode (``base.PromptMode``), one strategy of the
forward step. ``full_history`` sends the agent's messages; ``incremental`` continues each chain from
its exact ids (``incremental.py``). The package imports nothing here: the store's index process and
the flow's data types import parts of it without the modes."""
