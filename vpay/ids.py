"""Wire identifiers: a type prefix and 24 random base62 characters (about 143 bits).

The prefix says what an id names (``evt_``, ``we_``, ``pi_``, ``ch_``, ``cs_``, ``cus_``,
``acct_``), so an id pasted into the wrong endpoint is a clear 404, and a support engineer
can read a log line without a lookup. Random, not sequential: ids leak no volumes.
"""

from __future__ import annotations

import secrets
import string

_ALPHABET = string.ascii_letters + string.digits
ID_MAX_LENGTH = 40


def new_id(prefix: str) -> str:
    """A fresh id such as ``pi_3kT…``; ``prefix`` is letters only."""
    if not prefix.isalpha():
        raise ValueError("an id prefix is letters only")
    return f"{prefix}_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))
