"""`/monitor`: a static page (no build step) that polls `/monitor/state` every second."""
from __future__ import annotations

import time
from importlib.resources import files
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from . import prometheus
from .activity import Activity

PAGE = files(__package__).joinpath("monitor.html")  # package data (pyproject: "*.html")


class Monitor:
    """Serves the page and its state.

    Args:
        activity: HTTP requests in flight and completed.
        engine_stats: Returns `Engine.stats()`, or None while the model loads.
        model_id: Returns the loaded model's id, or None.
        outcomes: Returns requests by kind and outcome (`server.core.outcomes`).
    """

    def __init__(self, activity: Activity, engine_stats: Callable[[], dict | None],
                 model_id: Callable[[], str | None], outcomes: Callable[[], dict] = dict) -> None:
        self.activity = activity
        self.outcomes = outcomes
        self.engine_stats = engine_stats
        self.model_id = model_id
        self._page = PAGE.read_text(encoding="utf-8")

    def metrics_text(self) -> str:
        """The /metrics exposition (the same numbers the page shows)."""
        return prometheus.render(self.engine_stats(), self.activity.totals, len(self.activity.active),
                                 self.outcomes())

    def state(self) -> dict[str, Any]:
        """Everything the page shows, in one JSON object."""
        stats = self.engine_stats()
        return {"time": time.time(), "model": self.model_id(),
                "metrics": prometheus.parse(self.metrics_text()),
                "engine": {k: v for k, v in (stats or {}).items() if k != "cache"},
                "cache": (stats or {}).get("cache", {}), "outcomes": self.outcomes(),
                **self.activity.snapshot()}

    async def page(self, request: Request) -> Response:
        return HTMLResponse(self._page, headers={"Cache-Control": "no-store"})

    async def state_endpoint(self, request: Request) -> Response:
        return JSONResponse(self.state(), headers={"Cache-Control": "no-store"})

    async def metrics(self, request: Request) -> Response:
        return Response(self.metrics_text(), media_type=prometheus.CONTENT_TYPE)
