"""Random credentials (merchants' API keys, checkout client secrets).

Letters and digits only, so the log redaction's patterns (``sk_…``, ``cs_secret_…``) match
a whole token: ``token_urlsafe``'s ``-`` is a character a reader's eye, a URL-encoder or a
narrower pattern may treat as the token's end.
"""

from __future__ import annotations

import math
import secrets
import string

ALPHABET = string.ascii_letters + string.digits


def new_token(prefix: str, bits: int) -> str:
    """``prefix`` + enough random base62 characters for ``bits`` bits of entropy."""
    length = math.ceil(bits / math.log2(len(ALPHABET)))
    return prefix + "".join(secrets.choice(ALPHABET) for _ in range(length))
