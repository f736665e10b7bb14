"""The durable job queue and its runner (docs/runner.md).

Code running inside a job reaches the runner through ``current_job()``; its
``heartbeat()`` raises ``JobCancelled`` once an operator has cancelled the job.
"""

from jobs.runner.current import JobCancelled, NoCurrentJob, current_job

__all__ = ["JobCancelled", "NoCurrentJob", "current_job"]
