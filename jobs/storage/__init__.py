"""The queue's storage: the ``jobs`` table's SQL (enqueue, claim, leases, settle, pull
forward, health), and how each statement runs (durable or bookkeeping)."""
