"""``json_result``: how a non-streamed request that the engine could not finish is answered."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from freetoken.server.errors import APIError
from freetoken.server.generation import EngineFailure, StreamStopped
from freetoken.server.responses import json_result


def _request() -> Request:
    async def receive() -> dict:
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def _raise(exc: Exception) -> dict:
    raise exc


@pytest.mark.parametrize(("exc", "status"), [(StreamStopped("the server is shutting down"), 503),
                                             (EngineFailure("kernel failed"), 500)])
def test_a_request_ended_by_shutdown_is_a_503_an_engine_failure_a_500(exc, status):
    with pytest.raises(APIError) as info:
        asyncio.run(json_result(_request(), _raise(exc)))
    assert (info.value.status, str(info.value)) == (status, str(exc))


def test_a_finished_request_is_its_json_body():
    async def work() -> dict:
        return {"ok": 1}

    response = asyncio.run(json_result(_request(), work()))
    assert (response.status_code, response.body) == (200, b'{"ok":1}')
