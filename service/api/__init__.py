"""The HTTP/WebSocket API: thin routes over :mod:`service.models`."""
