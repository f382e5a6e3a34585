"""Blank texts: the served description's non-blank pattern, read by
Python's `re` as Schemathesis reads it, refuses exactly what the server
refuses as blank (a lone U+00A0 or U+0085 is blank to both; U+FEFF and
U+001C are not, though some regex dialects' `\\s` takes them)."""

import json
import re
import urllib.error
import urllib.request

import pytest

from conftest import API_KEY

BLANK = ["\u00a0", "\u0085", " \u3000\u2028\t"]
NOT_BLANK = ["\ufeff", "\u001c"]


def call(server, method, path, body=None):
    req = urllib.request.Request(
        server + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def schema(server, name):
    return call(server, "GET", "/openapi.json")[1]["components"]["schemas"][name]


@pytest.mark.parametrize("text", BLANK + NOT_BLANK)
def test_a_decision_state_is_blank_to_the_description_as_to_the_server(server, text):
    pattern = schema(server, "DecideRequest")["properties"]["state"]["pattern"]
    described = re.search(pattern, text) is not None
    status, body = call(server, "POST", "/v1/decide", {
        "state": text,
        "questions": [{"text": "Which one?", "options": ["yes", "no"]}]})
    if text in BLANK:
        assert not described, (pattern, text)
        assert status == 400, body
        assert body["error"]["param"] == "state", body
    else:
        assert described, (pattern, text)
        assert status == 200, body


@pytest.mark.parametrize("text", BLANK)
def test_a_task_example_state_is_blank_to_the_description_as_to_the_server(server, text):
    task = schema(server, "TaskRequest")
    pattern = task["properties"]["examples"]["items"]["properties"]["state"]["pattern"]
    assert re.search(pattern, text) is None, (pattern, text)
    assert re.search(task["properties"]["question"]["pattern"], text) is None
    status, body = call(server, "POST", "/v1/tasks", {
        "name": "blank-state", "question": "Which one?", "options": ["yes", "no"],
        "examples": [{"state": "It rains.", "label": "yes"}, {"state": text, "label": "no"}]})
    assert status == 400, body
    assert body["error"]["param"] == "examples[1].state", body
