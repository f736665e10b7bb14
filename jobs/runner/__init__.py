"""The runner: a worker process from claim to settle (docs/runner.md), and what a handler
sees of it (its context, the current job, its outcome)."""
