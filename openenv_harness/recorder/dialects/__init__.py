"""The agent APIs the recorder speaks (``base.Dialect``): ``chat`` (Pi, OpenCode) is the identity one
(``chat.py``), ``responses`` (Codex) and ``anthropic`` (Claude Code) translate at the two ends of the
same steps; ``routes.py`` says which route speaks which. The package imports nothing here: the
session's state imports the replay memory without the dialects."""
