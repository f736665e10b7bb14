import re

import pytest
from django.db import connection

from jobs import registry
from jobs.kinds import JobKind


@pytest.mark.django_db
def test_declared_kinds_registry_and_database_constraint_are_the_same_list():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'jobs_job_kind_known'")
        (definition,) = cursor.fetchone()
    in_constraint = set(re.findall(r"'([a-z_]+)'::", definition))
    assert set(JobKind.values) == registry.registered_kinds() == in_constraint
