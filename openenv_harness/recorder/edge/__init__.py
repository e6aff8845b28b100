"""The recorder's HTTP edge: where an agent's bytes arrive and its answer leaves, for every dialect.

``agent_protocol.py`` answers agent calls straight from uvicorn's parser (no ASGI cycle); the limits it
and the ASGI app apply as bytes arrive (``request_limits.py``); the one reader of an agent body on the
ASGI path and what a body may hold (``request_body.py``); keepalives for a long streaming call
(``keepalive.py``); server-sent events (``sse.py``); the token-count routes, which translate like a
dialect's call but never enter the call's steps (``count_tokens.py``); and the error shapes of routes
that are not agent calls (``error_handlers.py``). The package imports nothing here."""
