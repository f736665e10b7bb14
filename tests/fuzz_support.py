"""Schemathesis against a live server: every operation of ``GET /v1/openapi.json``, with
generated data that fits the description (positive) and that breaks it (negative), and
with the ids of real objects in the paths. Each answer must not be a 5xx, must have a
status the description lists, and must match its described body, content type and headers.
"""

from __future__ import annotations

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def fuzz(
    base_url: str, credential: str, *, examples: int, real_ids: dict[str, str], derandomize: bool = True
) -> list[str]:
    """Run every operation ``examples`` times per mode (and as often again per mode with
    the real ids for its path parameters); the failures, one readable entry each.
    ``derandomize``: the same cases every run (CI is repeatable); off, each run explores
    new ones."""
    schema = schemathesis.openapi.from_url(base_url + "/v1/openapi.json")
    session = requests.Session()
    headers = {"Authorization": f"Bearer {credential}"}
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        names = [parameter.name for parameter in operation.path_parameters]
        variants = [{}]
        if names and all(name in real_ids for name in names):
            variants.append({name: real_ids[name] for name in names})
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for path_parameters in variants:
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters or None)

                @given(case=strategy)
                @hypothesis_settings(
                    max_examples=examples,
                    deadline=None,
                    database=None,
                    derandomize=derandomize,
                    suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.generate, Phase.shrink],
                )
                def run(case) -> None:
                    case.call_and_validate(base_url=base_url, session=session, headers=headers, checks=CHECKS)

                try:
                    run()
                except (Exception, FailureGroup) as exc:  # collected: one run reports every operation that fails
                    failures.append(f"{operation.label} [{mode.value}, {path_parameters or 'generated ids'}]:\n{exc}")
    session.close()
    return failures
