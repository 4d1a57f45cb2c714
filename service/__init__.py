"""opml-service: streaming online metric learning (OPML / COPML) behind REST and WebSocket.

The algorithm lives in :mod:`service.core` (pure numpy); everything else in this package is
the service around it. Importing this package imports nothing heavy.
"""
