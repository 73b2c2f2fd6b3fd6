"""A small blocking HTTP client over the host's wasi:http/outgoing-handler.

It does what the Rust SDK's `berth_sdk::http` does, with the bindings
componentize-py generates for the world: one `send` that builds the request,
waits for the response and reads the whole body. No asyncio: a driver makes
one request at a time, so blocking on the pollable is enough.

The host decides where a request may go and adds the provider's credentials
itself; a refused request fails with the wasi:http error `HttpRequestDenied`.
The host also bounds the whole call with a deadline, so the client sets no
timeouts of its own.

Outside a component (unit tests on plain CPython) the bindings are absent or
stubs: `send` then goes to the transport `set_transport` installed, which
`berth_driver.testing.FakeHttp` does. `parse_url`, `encode_component` and
`Response` need no bindings at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple
from urllib.parse import quote

try:
    from componentize_py_types import Err, Ok
    from wit_world.imports import outgoing_handler, streams
    from wit_world.imports import wasi_http_types as wasi
except ImportError:
    # Plain CPython without bindings, or a world without wasi:http: only a
    # transport installed with `set_transport` can send.
    wasi = None  # type: ignore[assignment]

# `blocking-write-and-flush` takes at most 4096 bytes per call.
_WRITE_CHUNK = 4096
_READ_CHUNK = 64 * 1024


class HttpError(Exception):
    """The request failed before a response arrived, or its body could not
    be read. An HTTP error *status* is not an `HttpError`: it is a
    `Response` whose `status` says so."""


@dataclass
class Url:
    """An absolute `http` or `https` URL split the way wasi:http wants it."""

    https: bool
    authority: str
    path_and_query: str


def parse_url(text: str) -> Url:
    """Parses `scheme://authority[/path][?query][#fragment]`, with the same
    rules as the Rust SDK's `Url::parse`: the scheme is `http` or `https`,
    user info is refused (credentials are the host's business), the
    fragment is dropped. Raises `ValueError` saying what is wrong."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{json.dumps(text)}: {why}")

    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise bad("contains whitespace or control characters")
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise bad("not an absolute url")
    scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise bad("scheme must be http or https")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if not authority:
        raise bad("no host")
    why = _authority_problem(authority)
    if why:
        raise bad(why)
    tail = tail.split("#", 1)[0]
    if not tail:
        path_and_query = "/"
    elif tail.startswith("?"):
        path_and_query = "/" + tail
    else:
        path_and_query = tail
    return Url(https=scheme == "https", authority=authority, path_and_query=path_and_query)


def _authority_problem(authority: str) -> Optional[str]:
    """What is wrong with `host`, `host:port`, `[v6]` or `[v6]:port`, if anything."""
    if "@" in authority:
        return "user info is not supported; the host adds credentials"
    if authority.startswith("["):
        host, sep, after = authority[1:].partition("]")
        if not sep:
            return "unclosed ["
        if after.startswith(":"):
            port: Optional[str] = after[1:]
        elif not after:
            port = None
        else:
            return "junk after ]"
    else:
        host, sep, port_text = authority.partition(":")
        if sep and ":" in port_text:
            return "ipv6 addresses must be in brackets"
        port = port_text if sep else None
    if not host:
        return "no host"
    if port is not None and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return "bad port"
    return None


def encode_component(text: str) -> str:
    """Percent-encodes `text` for use as one path segment or query key or
    value: everything but `A-Z a-z 0-9 - . _ ~` is encoded."""
    return quote(text, safe="")


@dataclass
class Response:
    """A response: status, headers (names lowercased) and the whole body."""

    status: int
    headers: List[Tuple[str, str]]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        """The first value of header `name` (case-insensitive)."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def text(self) -> str:
        """The body as text; invalid UTF-8 is replaced."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> object:
        """The body as JSON; raises `ValueError` when it is not."""
        return json.loads(self.body)

    def is_success(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status <= 299


# What `send` hands a request to instead of wasi:http, when set: called
# with the method, the URL, the body and the headers, it returns the
# `Response` or raises `HttpError`.
Transport = Callable[[str, str, Optional[bytes], List[Tuple[str, str]]], Response]
_transport: Optional[Transport] = None


def set_transport(transport: Optional[Transport]) -> Optional[Transport]:
    """Sends every later request through `transport` instead of wasi:http
    (`None`: wasi:http again) and returns the one it replaces. For tests;
    `berth_driver.testing.FakeHttp` is one."""
    global _transport
    previous, _transport = _transport, transport
    return previous


def send(
    method: str,
    url: str,
    body: Optional[bytes] = None,
    headers: Sequence[Tuple[str, str]] = (),
) -> Response:
    """Sends one request and reads the whole response. Blocks until done;
    raises `HttpError` when no response arrived. `method` is upper case
    (`GET`, `POST`, ...)."""
    try:
        parsed = parse_url(url)
    except ValueError as e:
        raise HttpError(f"invalid url: {e}") from None
    if _transport is not None:
        return _transport(method, url, body, list(headers))
    if wasi is None:
        raise HttpError("request failed: no wasi:http in this world or process")
    payload = body or b""
    entries = [(k, v.encode()) for k, v in headers]
    if not any(k.lower() == "content-length" for k, _ in headers):
        # A declared length makes the request one complete message. Without
        # it the host streams a chunked body, and a server that answers
        # before the body's end may close the connection mid-request.
        entries.append(("content-length", str(len(payload)).encode()))
    try:
        fields = wasi.Fields.from_list(entries)
    except Err as e:
        raise HttpError(f"invalid header: {_case_name(e.value)}") from None
    request = wasi.OutgoingRequest(fields)
    try:
        request.set_method(_method(method))
        request.set_scheme(wasi.Scheme_Https() if parsed.https else wasi.Scheme_Http())
        request.set_authority(parsed.authority)
        request.set_path_with_query(parsed.path_and_query)
        outgoing = request.body()
    except Err:
        raise HttpError(f"invalid url: {url!r}: refused by the host") from None

    # Hand the request over first and write the body after: the host reads
    # the body while it sends, so a large body written before `handle` could
    # fill the pipe and block forever.
    try:
        future = outgoing_handler.handle(request, None)
    except Err as e:
        raise HttpError(_request_error(e.value)) from None
    write_error = _write_body(outgoing, payload)

    with future:
        with future.subscribe() as pollable:
            pollable.block()
        result = future.get()
    if isinstance(result, Ok) and isinstance(result.value, Ok):
        # A response is the truth about the request even if writing the body
        # failed (a server may answer before reading it all).
        return _read_response(result.value.value)
    if isinstance(result, Ok):
        raise HttpError(_request_error(result.value.value))
    raise HttpError(write_error or "response: the response future yielded nothing")


_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")


def _method(name: str) -> wasi.Method:
    """`GET` -> `Method_Get()`; a method wasi:http has no case for is `Other`."""
    if name in _METHODS:
        return getattr(wasi, f"Method_{name.capitalize()}")()
    return wasi.Method_Other(name)


def _write_body(outgoing: wasi.OutgoingBody, payload: bytes) -> Optional[str]:
    """Writes and finishes the request body; returns what went wrong, if anything."""
    try:
        if payload:
            # The stream is a child of the body: it must be dropped before
            # the body is finished.
            with outgoing.write() as stream:
                for start in range(0, len(payload), _WRITE_CHUNK):
                    stream.blocking_write_and_flush(payload[start : start + _WRITE_CHUNK])
        wasi.OutgoingBody.finish(outgoing, None)
    except Err as e:
        return f"request body: {_stream_error(e.value)}"
    return None


def _read_response(incoming: wasi.IncomingResponse) -> Response:
    with incoming:
        status = incoming.status()
        with incoming.headers() as fields:
            headers = [
                (k.lower(), v.decode("utf-8", errors="replace")) for k, v in fields.entries()
            ]
        try:
            body = incoming.consume()
        except Err:
            raise HttpError("response: body already consumed") from None
        try:
            stream = body.stream()
        except Err:
            raise HttpError("response: body stream already taken") from None
        chunks = []
        with stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(_READ_CHUNK))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise HttpError(f"response: {_stream_error(e.value)}") from None
        with wasi.IncomingBody.finish(body):
            pass
    return Response(status, headers, b"".join(chunks))


def _stream_error(error: object) -> str:
    if isinstance(error, streams.StreamError_LastOperationFailed):
        with error.value as err:
            code = wasi.http_error_code(err)
            return _request_error(code) if code is not None else err.to_debug_string()
    if isinstance(error, streams.StreamError_Closed):
        return "stream closed"
    return _request_error(error)


def _request_error(code: object) -> str:
    """`request failed: HttpRequestDenied`, with the case's payload if it has one."""
    name = _case_name(code)
    detail = getattr(code, "value", None)
    return f"request failed: {name}" if detail is None else f"request failed: {name}: {detail}"


def _case_name(value: object) -> str:
    """`ErrorCode_HttpRequestDenied` -> `HttpRequestDenied`."""
    return type(value).__name__.split("_", 1)[-1]
