"""The control plane: sessions, records, the weight-sync fence, health and metrics. Admin token required.

One concept per module: ``access`` (who may call), ``sessions`` (a rollout's session, its records),
``fence`` (weight sync), ``health`` (whether calls can be recorded; metrics), ``exact_template``
(why a session is refused for its template). ``router`` is all of them under ``/admin``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from openenv_harness.recorder.admin import access, fence, health, sessions
from openenv_harness.recorder.admin.access import require_admin
from openenv_harness.recorder.admin.health import metrics_router

router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])
for part in (health.router, fence.router, access.router, sessions.router):
    router.include_router(part)

__all__ = ["metrics_router", "router"]
