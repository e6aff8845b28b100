"""Chat bodies the recorder refuses before the engine, with the status and code each must get: one
table for the parse step alone (``call/test_step_parse.py``) and for the whole HTTP path
(``test_bad_input.py``), against a recorder whose body limit is 64 KiB."""

from __future__ import annotations

LIMIT = 64 * 1024

REFUSED: list[tuple[bytes, int, str]] = [
    (b"{not json", 400, "invalid_json"),
    (b"[1,2,3]", 400, "invalid_body"),
    (b'{"model":"m"}', 400, "invalid_messages"),
    (b'{"messages":[]}', 400, "invalid_messages"),
    (b'{"messages":"hello"}', 400, "invalid_messages"),
    (b'{"messages":[{"content":"no role"}]}', 400, "invalid_messages"),
    (b'{"messages":[{"role":"user","content":"x"}],"n":3}', 400, "invalid_n"),
    (b'{"messages":[{"role":"user","content":"x"}],"n":true}', 400, "invalid_n"),
    (b'{"messages":[{"role":"user","content":"x"}],"tools":{"a":1}}', 400, "invalid_tools"),
    (b'{"messages":[{"role":"user","content":"x"}],"stream":"yes"}', 400, "invalid_stream"),
    (b'{"messages":[{"role":"user","content":"' + b"x" * 70_000 + b'"}]}', 413, "body_too_large"),
    # too large is said before whether it is JSON at all
    (b"{" + b" " * 70_000, 413, "body_too_large"),
]
