"""A batch input line's envelope checks and the shapes of error lines: pure logic, no server."""

from __future__ import annotations

from conveyor.api.batch.lines import parse_line
from conveyor.api.batch.results import error_line
from conveyor.api.batch.runner import line_job_id
from conveyor.wire.batch import BatchLine, LineError


def test_a_valid_envelope_parses() -> None:
    parsed = parse_line('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}', 1)
    assert isinstance(parsed, BatchLine) and parsed.custom_id == "a"


def test_malformed_lines_say_why_and_keep_the_custom_id() -> None:
    bad_json = parse_line("{nope", 3)
    assert isinstance(bad_json, LineError) and bad_json.code == "invalid_json"
    assert "line 3" in bad_json.message
    no_body = parse_line('{"custom_id": "b", "method": "POST", "url": "/v1/completions"}', 4)
    assert isinstance(no_body, LineError) and no_body.custom_id == "b" and "body" in no_body.message
    wrong_url = parse_line('{"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {}}', 5)
    assert isinstance(wrong_url, LineError) and wrong_url.code == "invalid_url"
    assert "/v1/chat/completions" in wrong_url.message  # names what is served
    surrogate = parse_line('{"custom_id": "d", "method": "POST", "url": "/v1/completions", '
                           '"body": {"prompt": "\\ud800"}}', 6)
    assert isinstance(surrogate, LineError) and surrogate.code == "invalid_json"


def test_error_lines_take_openais_shapes() -> None:
    refused = error_line("j1", LineError(custom_id="a", code="invalid_request", message="m", status_code=422,
                                         body={"error": {"message": "m"}}))
    assert refused.response is not None and refused.response.status_code == 422 and refused.error is None
    malformed = error_line("j2", LineError(code="invalid_json", message="bad"))
    assert malformed.response is None and malformed.error is not None
    assert malformed.error.code == "invalid_json"
    assert malformed.id == "batch_req_j2"


def test_a_lines_job_id_is_the_same_for_every_process() -> None:
    assert line_job_id("batch_x", 3) == line_job_id("batch_x", 3) != line_job_id("batch_x", 4)
    assert len(line_job_id("batch_x", 3)) == 32
