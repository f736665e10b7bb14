"""jobs.primitives.schema.PayloadSchema: the strict validator a payload passes at enqueue and at claim."""

from __future__ import annotations

import pytest

from jobs.adapters.tasks_backend import TASK_SCHEMA
from jobs.primitives.schema import PayloadError, PayloadSchema

SCHEMA = PayloadSchema(
    required={"name": "str", "count": "int", "ratio": "float", "flag": "bool", "items": "list", "meta": "dict"},
    optional={"note": "str"},
)
VALID = {"name": "a", "count": 1, "ratio": 0.5, "flag": False, "items": [], "meta": {}}


@pytest.mark.parametrize(
    "payload",
    [
        VALID,
        {**VALID, "note": "optional given"},
        {**VALID, "ratio": 2},  # an int is a valid float
        {**VALID, "count": -7, "items": [1, "x", None], "meta": {"nested": {"ok": True}}},
    ],
)
def test_payload_schema__accepts_a_valid_payload(payload):
    assert SCHEMA.validate(payload) is None


def test_payload_schema__accepts_an_empty_payload_for_an_empty_schema():
    assert PayloadSchema().validate({}) is None


def test_payload_schema__refuses_an_unknown_field_and_names_it():
    with pytest.raises(PayloadError, match=r"unknown field\(s\): extra, zeta"):
        SCHEMA.validate({**VALID, "zeta": 1, "extra": 2})


def test_payload_schema__refuses_a_missing_required_field_and_names_it():
    payload = dict(VALID)
    del payload["count"]
    with pytest.raises(PayloadError, match="missing required field 'count'"):
        SCHEMA.validate(payload)


@pytest.mark.parametrize(
    ("field", "value", "expected", "actual"),
    [
        ("name", 5, "str", "int"),
        ("count", "5", "int", "str"),
        ("count", 1.5, "int", "float"),
        ("ratio", "0.5", "float", "str"),
        ("items", {}, "list", "dict"),
        ("meta", [], "dict", "list"),
        ("flag", 1, "bool", "int"),
        ("name", None, "str", "null"),
    ],
)
def test_payload_schema__refuses_a_wrong_type_naming_field_and_types(field, value, expected, actual):
    with pytest.raises(PayloadError, match=f"field '{field}' must be {expected}, not {actual}"):
        SCHEMA.validate({**VALID, field: value})


@pytest.mark.parametrize("field", ["count", "ratio"])
def test_payload_schema__refuses_a_bool_where_a_number_is_declared(field):
    # True is an int in Python, but not in a payload schema.
    with pytest.raises(PayloadError, match=f"field '{field}' must be .*, not bool"):
        SCHEMA.validate({**VALID, field: True})


def test_payload_schema__refuses_a_wrong_type_in_an_optional_field():
    with pytest.raises(PayloadError, match="field 'note' must be str, not int"):
        SCHEMA.validate({**VALID, "note": 3})


@pytest.mark.parametrize("payload", [None, [], "text", 3, ("a",)])
def test_payload_schema__refuses_a_payload_that_is_not_an_object(payload):
    with pytest.raises(PayloadError, match="payload must be a JSON object"):
        SCHEMA.validate(payload)


def test_payload_schema__refuses_to_declare_an_unknown_type():
    with pytest.raises(ValueError, match="unknown type 'decimal'"):
        PayloadSchema(required={"amount": "decimal"})


def test_a_payload_error_is_a_value_error():
    assert issubclass(PayloadError, ValueError)


def test_the_task_schema__requires_task_args_and_kwargs_and_allows_backend():
    TASK_SCHEMA.validate({"task": "m.f", "args": [], "kwargs": {}})
    TASK_SCHEMA.validate({"task": "m.f", "args": [], "kwargs": {}, "backend": "default"})
    with pytest.raises(PayloadError):
        TASK_SCHEMA.validate({"task": "m.f", "args": []})
