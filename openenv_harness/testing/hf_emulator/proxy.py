"""The port proxy: ``/v1/.../proxy/{port}/{path}`` spliced to a server inside the sandbox.

As in sbx-server: connect to ``127.0.0.1:<port>`` (dedicated) or ``<home>/.sbx/proxy/<port>.sock``
(pooled), replay the request head with every header except ``x-sandbox-token`` -- so
``Authorization``, ``Host``, ``Upgrade`` and ``Sec-WebSocket-*`` pass through -- then copy raw bytes
both ways until either side closes. The inner server does any WebSocket upgrade itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from openenv_harness.testing.hf_emulator.wire import HttpFailure, Request, error_response

_COPY_SIZE = 65536


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(_COPY_SIZE):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (ConnectionError, OSError):
        sink.transport.abort()


async def splice(request: Request, port_text: str, inner_path: str, *, unix_dir: Path | None) -> None:
    """Proxy one connection to the inner server; the client connection is consumed."""
    request.content_length()  # refuses chunked bodies with 411, as the real proxy does
    if not port_text.isdigit() or int(port_text) == 0 or int(port_text) > 65535:
        raise HttpFailure(400, f"invalid port {port_text!r}")
    port = int(port_text)
    writer = request.writer
    try:
        if unix_dir is None:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            socket_path = unix_dir / f"{port}.sock"
            if socket_path.is_symlink() or not socket_path.is_socket():
                raise OSError(f"{socket_path} is not a socket")
            up_reader, up_writer = await asyncio.open_unix_connection(str(socket_path))
    except OSError:
        writer.write(error_response(502, f"cannot reach port {port} inside the sandbox", close=True))
        await writer.drain()
        return
    target = inner_path or "/"
    if request.query_string:
        target += "?" + request.query_string
    head = [f"{request.method} {target} HTTP/1.1"]
    head += [f"{name}: {value}" for name, value in request.raw_headers if name.lower() != "x-sandbox-token"]
    up_writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    try:
        await asyncio.gather(_copy(request.reader, up_writer), _copy(up_reader, writer))
    finally:
        up_writer.transport.abort()
