"""opml-service: streaming online metric learning (OPML / COPML) behind REST and WebSocket.

Architecture
============

The folders, and what each may import from the others (import-linter's contracts in
``pyproject.toml``, run by ``tests/test_architecture.py``, which also checks this list module by
module and that no import cycle exists anywhere in ``service/``):

* ``core/`` -- the algorithm: learner, closed-form updates, calibration, estimators (pure
  numpy/numba; no web, Redis or asyncio). Imports nothing of the service.
* ``errors.py`` -- the domain's errors (a slug and a sentence each). Imports nothing.
* ``config.py`` -- every setting (pydantic-settings, ``OPML_*``). Imports nothing.
* ``logs.py`` -- the logging configuration of the command line (one format). Imports nothing.
* ``allocator.py`` -- the C allocator's thresholds for large buffers, set by the command line.
  Imports nothing.
* ``telemetry.py`` -- the Prometheus telemetry (event series) and each model's bound series. Imports
  ``core``.
* ``storage/`` -- Redis: key names, byte layouts, the Lua scripts (``storage/lua/``), one store
  class per aggregate over a shared client, the group-commit queue, the append lane (one
  pipelined connection for the appends), the checkpoint record, the embedded server. Imports
  ``core`` and ``errors`` (the domain's errors are its vocabulary too): every failure of the
  Redis client leaves it as ``StorageUnavailable`` (``storage/errors.py``).
* ``engine/`` -- the runtime engine: registry, one model's runtime, writer, snapshots, status,
  lease, admission, ``?wait=true`` results. Imports ``core``, ``storage``, ``errors``,
  ``config``, ``telemetry``; not ``redis`` (it catches the domain's errors only), nor any web
  library.
* ``api/`` -- HTTP/WebSocket: parsing, schemas, routes, the lean path, presenters,
  problem+json (the one mapping from errors to answers, middleware included), authentication,
  limits, observation. Imports all of the above but ``storage``, and not ``redis``: what it
  needs of the log comes through the engine.
* ``app.py`` (the app factory: Redis, engine and API wired together) and ``__main__.py`` (the
  command line) may import anything.

The engine takes arrays and class keys and answers with snapshots, results and statuses; it
knows no HTTP. The API turns requests into those and answers back; the core knows neither.

The durability path of a sample, with the file that does each step:

1. **request** -- ``api/routes/samples.py`` (REST) or ``api/routes/stream.py`` (WebSocket)
   parse the body (``api/parsing.py``) and hand arrays and class keys to ``api/ingestion.py``;
2. **admission** -- ``engine/admission.py`` holds the append back while the learner is more
   than ``OPML_MAX_UNAPPLIED`` samples behind (backpressure, in arrival order);
3. **group commit** -- ``storage/group_commit.py`` gathers the appends that arrive together;
4. **Lua append** -- ``storage/logstore.py`` (``storage/lua/append.lua``, sent on the append lane of
   ``storage/lane.py`` on a single server): one script assigns the seqs, records
   the idempotency answer and ``XADD``\\ s one entry per request/frame, atomically; the ack is
   sent only after it returned (with ``OPML_REDIS_WAIT_REPLICAS`` = n, and after ``WAIT n``
   confirmed n replicas have it);
5. **log** -- the model's Redis Stream ``opml:{name}:log`` (``storage/keys.py``, layout in
   ``storage/codec.py``), persisted by Redis' AOF;
6. **writer** -- ``engine/writer.py`` reads the log in order and applies it with the core
   learner in a worker thread;
7. **snapshot** -- ``engine/snapshot.py``: an immutable view published after each batch;
   queries read only snapshots;
8. **checkpoint** -- ``storage/checkpoint.py`` (the record) written by the writer with the
   lease's fencing token (``engine/lease.py``) through ``storage/logstore.py``
   (``storage/lua/checkpoint.lua``),
   which trims the log behind it. A restart loads the checkpoint and replays the log tail.

Importing this package imports nothing heavy.
"""
