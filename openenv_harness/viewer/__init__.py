"""The trace viewer: a page served by the recorder that shows sessions, calls, tokens and chains.

People debugging a rollout need to *see* where a chain forked and why: which call drifted, at
which prompt position, what the agent sent and what the model sampled, which ids a trainer would
train on, where a budget stopped the session and what the engine said when a call failed. The
page is admin-only (header or login cookie), works offline, and reads digests rather than whole
records so that sessions with very long prompts stay responsive.

``viewer_router`` holds every route; the recorder app includes it.
"""

from fastapi import APIRouter

from openenv_harness.viewer.api import API_PREFIX, api_router
from openenv_harness.viewer.pages import VIEWER_PATH, pages_router

viewer_router = APIRouter()
viewer_router.include_router(pages_router)
viewer_router.include_router(api_router)

__all__ = ["API_PREFIX", "VIEWER_PATH", "api_router", "pages_router", "viewer_router"]
