"""``python -m service`` / ``opml-service``: run the API under uvicorn.

Settings come from ``OPML_*`` environment variables (see :mod:`service.config`). SIGINT and
SIGTERM shut down gracefully: writers finish their batch, final checkpoints are written, and the
embedded redis-server is stopped.
"""

from __future__ import annotations

import logging
import sys

import uvicorn

from service.config import get_settings
from service.main import create_app
from service.security import KeyRing, bind_refusal, is_loopback

log = logging.getLogger("service")


def main() -> None:
    settings = get_settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        keys = KeyRing.parse(settings.api_keys)
    except ValueError as exc:
        log.error("%s", exc)
        sys.exit(2)
    refusal = bind_refusal(settings.host, keys, settings.allow_insecure_bind)
    if refusal is not None:
        log.error("%s", refusal)
        sys.exit(2)
    if keys.enabled:
        log.info("authentication on: %d API key(s) configured", len(keys))
    elif is_loopback(settings.host):
        log.warning(
            "authentication OFF (no OPML_API_KEYS): serving loopback %s only", settings.host
        )
    else:
        log.warning(
            "authentication OFF and OPML_ALLOW_INSECURE_BIND=true: anyone reaching %s:%d can "
            "create, feed and delete models",
            settings.host,
            settings.port,
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
