"""Django's setup with the cyclic garbage collector paused, and what it built frozen after.

Setup imports every app, model, admin and library and builds objects that live as long as
the process. While they are being made, the collector runs every 700 allocations and
traverses the growing heap again and again, finding nothing to free: a third of
``runworker``'s startup CPU (0.87-1.09 s → 0.59-0.73 s, ``runworker --burst`` on an empty
queue, this 2-core machine), and the suite starts hundreds of processes. Afterwards one
collection, then :func:`gc.freeze`: the survivors move to a generation no collection
traverses again, so a full collection in a long-running worker walks only what it made
since, and the children ``runworker`` forks share those pages instead of copying them as a
collection touches them.

Used by the entry points that set Django up: ``manage.py``, ``vpay/wsgi.py`` and ``vpay/asgi.py``.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def startup_heap() -> Iterator[None]:
    """Pause the collector inside; collect once and freeze the survivors on the way out
    (also when setup fails, so no process is left with the collector off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        if was_enabled:
            gc.enable()
