"""HTTP route `GET /lantern/status`: what the pack holds in memory (for users and for tests)."""
from __future__ import annotations

from aiohttp import web
from server import PromptServer

from . import runtime


@PromptServer.instance.routes.get("/lantern/status")
async def lantern_status(request: web.Request) -> web.Response:
    import gc

    gc.collect()
    return web.json_response({"live_models": runtime.live_models()})
