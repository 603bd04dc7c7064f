"""The Responses API takes vLLM's `priority` as the other routes do: onto the wire, or a 400."""

import pytest

from actors.http.errors import ApiError
from actors.http.options import GatewayOptions
from actors.http.responses.request import Caller, parse_responses_body

CALLER = Caller(tenant="t", request_id=None, model_names=("m",), adapters=[])


@pytest.mark.parametrize("priority", [-4, 0, 9, None])
def test_priority_reaches_the_wire_request(priority: int | None) -> None:
    parsed = parse_responses_body({"model": "m", "input": "hi", "priority": priority}, None, CALLER, GatewayOptions())
    assert parsed.wire.priority == (priority or 0)


@pytest.mark.parametrize("bad", [True, 2.5, "urgent", 2**40])
def test_a_bad_priority_is_a_400_naming_it(bad: object) -> None:
    with pytest.raises(ApiError) as raised:
        parse_responses_body({"model": "m", "input": "hi", "priority": bad}, None, CALLER, GatewayOptions())
    assert raised.value.status == 400 and raised.value.param == "priority"
