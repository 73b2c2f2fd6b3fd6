"""A fake host for a driver's unit tests on plain CPython, outside the
component: answers to HTTP requests, the errors a call returns, the log,
and what `berth_driver.auth.info` reads.

The driver's own imports (`wit_world`, `componentize_py_types`) come from
the stubs componentize-py writes for the world, which have the contract's
real types and host functions that raise `NotImplementedError`:

    componentize-py -d wit -w berth:driver/driver-plugin bindings build/bindings
    PYTHONPATH=build/bindings python -m unittest

`FakeHttp` stands in for wasi:http, so `berth_driver.http.send` never
reaches those stubs:

    with FakeHttp() as cloud:
        cloud.respond("GET", "http://cloud/v1/limits", json={"max_instances": 5})
        self.assertEqual(driver.limits().max_instances, 5)
    self.assertEqual([r.url for r in cloud.requests], ["http://cloud/v1/limits"])
"""

import json as _json
import types as _types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import (
    Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union,
)

from berth_driver import auth, http
from berth_driver.http import HttpError, Response

_ABSENT = object()


def response(
    status: int = 200,
    json: Any = _ABSENT,
    body: bytes = b"",
    headers: Sequence[Tuple[str, str]] = (),
) -> Response:
    """A `Response` as `send` returns it: header names lowercased, and
    `json` (any JSON value, `None` included) written as the body with a
    `content-type: application/json` header."""
    headers = [(k.lower(), v) for k, v in headers]
    if json is not _ABSENT:
        body = _json.dumps(json).encode()
        if not any(k == "content-type" for k, _ in headers):
            headers.append(("content-type", "application/json"))
    return Response(status, headers, body)


@dataclass
class Request:
    """One request the driver sent, as it passed it to `send`."""

    method: str
    url: str
    headers: List[Tuple[str, str]]
    body: Optional[bytes]

    def header(self, name: str) -> Optional[str]:
        """The first value of header `name` (case-insensitive)."""
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def text(self) -> str:
        """The body as text (empty when there is none)."""
        return (self.body or b"").decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON (`None` when there is no body)."""
        return None if self.body is None else _json.loads(self.body)


# What a route answers: a response, or the message of an `HttpError`.
_Answer = Union[Response, str]


class FakeHttp:
    """A fake wasi:http for `berth_driver.http.send`, with answers queued per
    method and URL and every request recorded in `requests`.

    Each answer serves one request, in the order they were queued for that
    method and exact URL (query included). A request with no answer left is
    recorded and fails the test with an `AssertionError` naming it.

    Install it with `with FakeHttp() as cloud:` (or `install()` and
    `uninstall()`); answers can be queued before or inside the block."""

    def __init__(self) -> None:
        self.requests: List[Request] = []
        self._answers: Dict[Tuple[str, str], List[_Answer]] = {}
        self._previous: Optional[http.Transport] = None

    def respond(
        self,
        method: str,
        url: str,
        status: int = 200,
        json: Any = _ABSENT,
        body: bytes = b"",
        headers: Sequence[Tuple[str, str]] = (),
    ) -> "FakeHttp":
        """Queues a response (see `response`) for the next `method` request
        to `url`."""
        return self._queue(method, url, response(status, json, body, headers))

    def refuse(
        self, method: str, url: str, message: str = "request failed: HttpRequestDenied"
    ) -> "FakeHttp":
        """Queues no response at all: the next `method` request to `url`
        raises `HttpError(message)`, as a request the sandbox refuses or a
        connection that fails does."""
        return self._queue(method, url, message)

    def pending(self) -> List[Tuple[str, str]]:
        """The method and URL of every answer not used yet, for a test that
        checks the driver made every request it should."""
        return [key for key, answers in self._answers.items() for _ in answers]

    def install(self) -> "FakeHttp":
        self._previous = http.set_transport(self)
        return self

    def uninstall(self) -> None:
        http.set_transport(self._previous)
        self._previous = None

    def __enter__(self) -> "FakeHttp":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def __call__(
        self, method: str, url: str, body: Optional[bytes], headers: List[Tuple[str, str]]
    ) -> Response:
        self.requests.append(Request(method, url, list(headers), body))
        answers = self._answers.get((method.upper(), url))
        if not answers:
            raise AssertionError(
                f"no answer queued for {method} {url}; queued: {self.pending() or 'nothing'}"
            )
        answer = answers.pop(0)
        if isinstance(answer, str):
            raise HttpError(answer)
        return answer

    def _queue(self, method: str, url: str, answer: _Answer) -> "FakeHttp":
        self._answers.setdefault((method.upper(), url), []).append(answer)
        return self


def error_of(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The contract error `call(*args, **kwargs)` returns (what it passed to
    `fail`); an `AssertionError` when it returns normally."""
    from componentize_py_types import Err

    try:
        call(*args, **kwargs)
    except Err as e:
        return e.value
    raise AssertionError(f"{getattr(call, '__name__', call)} returned no error")


@contextmanager
def capture_log() -> Iterator[List[Tuple[Any, str, List[Tuple[str, str]]]]]:
    """Records what the driver writes with `log.log(level, message, fields)`
    (`from wit_world.imports import log`) instead of calling the host:
    yields the list of `(level, message, fields)` records."""
    from wit_world.imports import log

    records: List[Tuple[Any, str, List[Tuple[str, str]]]] = []
    original = log.log
    log.log = lambda level, message, fields: records.append((level, message, list(fields)))
    try:
        yield records
    finally:
        log.log = original


@contextmanager
def fake_auth(answers: Mapping[str, Any]) -> Iterator[List[str]]:
    """Answers `berth_driver.auth.info(host)` in the host's place while the
    block runs: `answers[host]` is the JSON text to return (a `str`), `None`,
    or one of the contract's errors, which the call raises as the host's
    `Err(error)`. A host not in `answers` has no credential exchanged for a
    token: `None`, as the host answers. Yields the list of hosts asked, in
    order."""
    from componentize_py_types import Err

    asked: List[str] = []

    def auth_info(host: str) -> Optional[str]:
        asked.append(host)
        answer = answers.get(host)
        if answer is None or isinstance(answer, str):
            return answer
        raise Err(answer)

    original = auth._auth
    auth._auth = _types.SimpleNamespace(auth_info=auth_info)  # type: ignore[assignment]
    try:
        yield asked
    finally:
        auth._auth = original
