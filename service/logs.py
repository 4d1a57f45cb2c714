"""The service's logging: one format for every line, uvicorn's included, and no line per request
unless asked.

uvicorn installs its own formatters (``INFO:     ...``) unless told not to; the command line
configures the root logger once (:func:`configure`) and gives uvicorn no configuration of its
own, so its loggers (``uvicorn.error``, ``uvicorn.access``) write through the same handler in
the same format as the service's.

The access log (a line per HTTP request, uvicorn's ``uvicorn.access``) is off by default: at a
few thousand requests per second it buries everything else, and the telemetry counts the
requests anyway (``opml_http_request_duration_seconds``). ``OPML_ACCESS_LOG=true`` turns it on,
at info level, and so does ``OPML_LOG_LEVEL=debug``. uvicorn logs a WebSocket's handshake and
close through ``uvicorn.error`` at info level: with the access log off they are demoted to debug
(:class:`AccessLinesAtDebug`), like the access log they belong to.

>>> record = logging.LogRecord("uvicorn.error", logging.INFO, "", 0, "connection closed", (), None)
>>> AccessLinesAtDebug().filter(record), record.levelname
(False, 'DEBUG')
"""

from __future__ import annotations

import logging
import logging.config

#: The format of every line: time, level, logger, message.
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The messages of ``uvicorn.error`` that are really access lines: a WebSocket's handshake
#: (``<client> - "WebSocket <path>" [accepted]`` / a status) and its close.
_ACCESS_MESSAGES = ('%s - "WebSocket %s"', "connection open", "connection closed")


def access_log(log_level: str, requested: bool) -> bool:
    """Whether a line per request is logged: when asked, or at the debug level and below.

    >>> access_log("info", False), access_log("info", True), access_log("debug", False)
    (False, True, True)
    """
    return requested or log_level.lower() in ("debug", "trace")


class AccessLinesAtDebug(logging.Filter):
    """Demote uvicorn's WebSocket handshake and close lines to debug: shown only when the
    logger's effective level lets debug through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and str(record.msg).startswith(_ACCESS_MESSAGES):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def configure(log_level: str, requested_access_log: bool) -> bool:
    """Configure the root logger (stderr, :data:`FORMAT`, ``log_level``) and uvicorn's loggers
    to write through it; whether the access log is on (:func:`access_log`)."""
    on = access_log(log_level, requested_access_log)
    uvicorn_loggers = ("uvicorn", "uvicorn.error", "uvicorn.access")
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"service": {"format": FORMAT}},
            "handlers": {
                "stderr": {
                    "class": "logging.StreamHandler",
                    "formatter": "service",
                    "stream": "ext://sys.stderr",
                }
            },
            "root": {"level": log_level.upper(), "handlers": ["stderr"]},
            "loggers": {name: {"handlers": [], "propagate": True} for name in uvicorn_loggers},
        }
    )
    if not on:
        logging.getLogger("uvicorn.error").addFilter(AccessLinesAtDebug())
    return on
