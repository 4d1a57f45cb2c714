"""The runtime engine: the models of this process and everything that keeps them learning.

It takes arrays and class keys, answers with snapshots, results and statuses, and knows no
HTTP. The modules, each named for its job: :mod:`~service.engine.registry` (load, create,
delete, leases of all models), :mod:`~service.engine.runtime` (one model and its operations),
:mod:`~service.engine.writer` (the single writer: log -> learner -> snapshots, checkpoints),
:mod:`~service.engine.snapshot` (what queries read), :mod:`~service.engine.status` (the one read
model of a model's state), :mod:`~service.engine.lease`, :mod:`~service.engine.admission`
(backpressure) and :mod:`~service.engine.results` (``?wait=true``). Import them by module: this
package's ``__init__`` imports nothing, so no import cycle can run through it.
"""
