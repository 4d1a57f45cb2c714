"""The HTTP/WebSocket API: parsing, thin routes over the engine (:mod:`service.engine`), and
the presentation of its answers and errors."""
