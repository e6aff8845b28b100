"""The ``files/*`` routes of an emulated sandbox (stat, read, write, list, delete, mkdir).

Shapes follow the real server: a ``FileEntry`` JSON with exactly the client's fields, 404 for a
missing path, raw bytes for reads and writes with ``offset``/``length``/``truncate_to`` ranges.
"""

from __future__ import annotations

import os
import shutil
import stat as stat_module
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openenv_harness.testing.hf_emulator.wire import HttpFailure, Request, json_response, response

LIST_PAGE = 1000


def file_entry(path: Path, shown: str) -> dict[str, Any]:
    info = path.lstat()
    if stat_module.S_ISLNK(info.st_mode):
        kind = "symlink"
    elif stat_module.S_ISDIR(info.st_mode):
        kind = "dir"
    else:
        kind = "file"
    return {
        "name": path.name, "path": shown, "type": kind, "size": info.st_size,
        "mtime_ms": int(info.st_mtime * 1000), "mode": format(stat_module.S_IMODE(info.st_mode), "o"),
    }


def _int_param(request: Request, name: str) -> int | None:
    value = request.param(name)
    if value is None or value == "":
        return None
    if not value.isdigit():
        raise HttpFailure(400, f"{name} must be a non-negative integer")
    return int(value)


async def handle_files(request: Request, operation: str, resolve: Callable[[str], Path]) -> bytes:
    """Serve ``files/<operation>``; ``resolve`` maps a client path to a local one."""
    shown = request.param("path")
    if not shown:
        raise HttpFailure(400, "missing path")
    path = resolve(shown)
    if operation == "stat" and request.method == "GET":
        if not path.exists() and not path.is_symlink():
            raise HttpFailure(404, f"{shown}: no such file or directory")
        return json_response(200, file_entry(path, shown))
    if operation == "read" and request.method == "GET":
        if not path.is_file():
            raise HttpFailure(404, f"{shown}: no such file")
        offset = _int_param(request, "offset") or 0
        length = _int_param(request, "length")
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read() if length is None else handle.read(length)
        return response(200, data, content_type="application/octet-stream")
    if operation == "write" and request.method == "PUT":
        data = await request.body()
        offset = _int_param(request, "offset")
        truncate_to = _int_param(request, "truncate_to")
        path.parent.mkdir(parents=True, exist_ok=True)
        if offset is None:
            path.write_bytes(data)
        else:
            with path.open("r+b" if path.exists() else "w+b") as handle:
                handle.seek(offset)
                handle.write(data)
                if truncate_to is not None:
                    handle.truncate(truncate_to)
        mode = request.param("mode")
        if mode:
            try:
                os.chmod(path, int(mode, 8))
            except ValueError:
                raise HttpFailure(400, f"mode {mode!r} is not octal") from None
        return json_response(200, {"path": shown, "size": path.stat().st_size})
    if operation == "list" and request.method == "GET":
        if not path.is_dir():
            raise HttpFailure(404, f"{shown}: no such directory")
        after = request.param("after")
        names = sorted(n for n in os.listdir(path) if after is None or n > after)
        page = names[:LIST_PAGE]
        entries = [file_entry(path / n, shown.rstrip("/") + "/" + n) for n in page]
        return json_response(200, {"entries": entries, "next": page[-1] if len(names) > LIST_PAGE else None})
    if operation == "delete" and request.method == "DELETE":
        if not path.exists() and not path.is_symlink():
            raise HttpFailure(404, f"{shown}: no such file or directory")
        if path.is_dir() and not path.is_symlink():
            if request.param("recursive") == "1":
                shutil.rmtree(path)
            else:
                try:
                    path.rmdir()
                except OSError:
                    raise HttpFailure(409, f"{shown}: directory not empty") from None
        else:
            path.unlink()
        return json_response(200, {"path": shown, "deleted": True})
    if operation == "mkdir" and request.method == "POST":
        path.mkdir(parents=True, exist_ok=True)
        return json_response(200, {"path": shown})
    raise HttpFailure(404, f"no route {request.method} files/{operation}")
