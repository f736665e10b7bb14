"""Shared fixtures (registered in tests/conftest.py's pytest_plugins): the queue's side.

Jobs and dead letters themselves come from ``tests.factories.jobs``; what several files need
around them is the person at the ops console.
"""

from __future__ import annotations

import pytest

from tests.ops_support import OPERATOR_PERMS, staff_user


@pytest.fixture
def operator(client, django_user_model):
    """Olga, a staff user holding the ops console's permissions, signed in on ``client``."""
    user = staff_user(django_user_model, "olga", *OPERATOR_PERMS)
    client.force_login(user)
    return user
