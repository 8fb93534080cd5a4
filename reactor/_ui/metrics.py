"""``/metrics`` of a ``reactor serve`` process (``--metrics PORT``): its registry in the
Prometheus text format, or OpenMetrics when the scraper asks for it."""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["create_metrics_app"]


def create_metrics_app(registry: CollectorRegistry) -> Starlette:
    """An app that serves ``registry`` at ``GET /metrics``, read in a worker thread
    (a scrape reads the database)."""

    async def metrics(request: Request) -> Response:
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        body = await run_in_threadpool(encode, registry)
        return Response(body, headers={"Content-Type": content_type})

    return Starlette(routes=[Route("/metrics", metrics)])
