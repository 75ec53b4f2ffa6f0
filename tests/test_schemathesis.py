"""Property-based tests of the API against its own OpenAPI schema, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.stack import Stack, new_stack, serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # A 1 s cap on waits keeps generated `Prefer: wait=` and `?wait=` requests short.
    with serving(new_stack(tmp_path_factory.mktemp("schema"), INFERQ_MAX_WAIT_S="1")) as running:
        running.start_api()
        running.start_worker("digits")
        yield running


def test_no_server_errors_and_responses_match_the_schema(api_stack: Stack) -> None:
    # Driven directly rather than through schemathesis' pytest plugin, which this pytest breaks.
    schema = schemathesis.openapi.from_url(f"{api_stack.base}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    calls: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            calls.append(1)
            # The bar: no 5xx, and every response (errors included) as the schema says.
            case.call_and_validate(
                checks=[
                    not_a_server_error,
                    response_schema_conformance,
                    status_code_conformance,
                    content_type_conformance,
                ]
            )

        check()
    assert len(calls) >= 5 * len(operations)
