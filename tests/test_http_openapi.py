"""The served OpenAPI document against the server: schemathesis draws requests from
``/openapi.json`` for every route and checks each answer against the document (documented status
code, content type, headers and body schema) and that none is a 5xx, so that the two cannot
drift apart. Bounded: a few dozen examples per route, a few hundred in all."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from helpers.http import ServerThread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, checks
from schemathesis.core.result import Ok

EXAMPLES_PER_ROUTE = 25
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def api() -> Iterator[ServerThread]:
    with ServerThread(max_value_bytes=4096, max_key_bytes=256) as server:
        yield server


def _drive(operation: Any, url: str, statuses: dict[int, int]) -> None:
    """Draw requests for one operation (valid and invalid ones) and check every answer."""

    @settings(
        max_examples=EXAMPLES_PER_ROUTE,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data(), mode=st.sampled_from(list(GenerationMode)))
    def run(data: st.DataObject, mode: GenerationMode) -> None:
        case = data.draw(operation.as_strategy(mode))
        response = case.call_and_validate(base_url=url, checks=CHECKS, timeout=10)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    run()


def test_the_server_answers_as_its_openapi_document_says(api: ServerThread) -> None:
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), "schemathesis could not read some routes"
    # A watch and the page's event stream are endless streams (schemathesis would wait for their
    # end): they are pinned by tests/test_http_server.py and tests/test_ui_routes.py instead.
    streams = ("/v1/watch/{prefix}", "/v1/ui/events")
    checked = [op for op in operations if op.path not in streams]
    assert len(checked) == len(operations) - len(streams) >= 15
    statuses: dict[int, int] = {}
    for operation in checked:
        _drive(operation, api.url, statuses)
    assert sum(statuses.values()) >= 10 * len(checked)
    # Both sides were exercised: requests the server took and requests it refused.
    assert statuses.get(200, 0) >= 3 * len(checked), statuses
    assert sum(n for code, n in statuses.items() if 400 <= code < 500) >= len(checked), statuses


def test_every_path_template_names_its_parameters() -> None:
    """Each ``{name}`` in a path is declared as a path parameter of that name, and the integers
    are bounded (``{prefix}`` was declared as ``key``; integers had no bounds)."""
    from aioelastic.store.http._openapi import openapi_document

    document = openapi_document(4096, 1024)
    for path, item in document["paths"].items():
        declared = {p["name"] for p in item.get("parameters", []) if p["in"] == "path"}
        assert declared == set(re.findall(r"{(\w+)}", path)), path

    def integers(node: object) -> Iterator[dict[str, object]]:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                yield node
            for child in node.values():
                yield from integers(child)
        elif isinstance(node, list):
            for child in node:
                yield from integers(child)

    # What a client sends is bounded as the server bounds it (an add's result is any integer).
    sent: list[object] = []
    for item in document["paths"].values():
        sent.append(item.get("parameters", []))
        for method, operation in item.items():
            if method != "parameters":
                sent += [operation.get("parameters", []), operation.get("requestBody", {})]
    found = list(integers(sent))
    assert len(found) >= 8
    for schema in found:
        assert "minimum" in schema or "enum" in schema, schema
        assert "maximum" in schema or "enum" in schema, schema
