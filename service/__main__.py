"""``python -m service`` / ``opml-service``: run the API under uvicorn.

Settings come from ``OPML_*`` environment variables (see :mod:`service.config`). SIGINT and
SIGTERM shut down gracefully: writers finish their batch, final checkpoints are written, and the
embedded redis-server is stopped.
"""

from __future__ import annotations

import logging

import uvicorn

from service.config import get_settings
from service.main import create_app


def main() -> None:
    settings = get_settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        ws_max_size=settings.max_body_bytes,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
