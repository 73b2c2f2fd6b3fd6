"""A berth driver, in Python, for the simulated cloud (`berth sim`,
docs/sim-cloud.md).

It behaves like the Rust driver in plugins/sim: the same config, paging,
error mapping and tag rules, for contract `berth:driver@0.2.0`: `get` asks
the sim for the ids alone, `list` answers one page of the sim's a call, a
create sends berth's token as the sim's client token, and an instance whose
boot failed is reported `failed`, with the sim's fault. It talks to the sim's instance API over
wasi:http and sends no credentials: when the sim requires a token, the host
adds it.

componentize-py exports the class named after the WIT interface, `Driver`.
An error is returned to the host with `fail(error)`, which raises
componentize-py's `Err(error)` with one of the contract's error cases; any
other exception traps, and the host replaces the instance. The helpers for
HTTP, errors, tags and pages come from the SDK, `berth_driver`
(sdk/python), and so does `Defaults`, which answers the batch calls
(`create_many`, `delete_many`) as not supported: this example leaves the
sim's batch calls to the Rust driver.
"""

import json
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, TypeVar

from berth_driver import errors
from berth_driver.driver import Defaults
from berth_driver.errors import fail, invalid_config, permanent, transient
from berth_driver.http import HttpError, Response, encode_component, parse_url, send
from berth_driver.pages import only_ids
from berth_driver.tags import POOL_TAG, Tags, has_all, is_berth_tag
from wit_world import exports
from wit_world.imports import berth_driver_types as t

import sim_api

NAME = "python-example"
VERSION = "0.1.0"

# The sim's largest page.
MAX_PAGE_SIZE = 1000

T = TypeVar("T")


@dataclass(frozen=True)
class Sim:
    """The configured driver: what `configure` learned, nothing more."""

    pool_id: str
    # `http(s)://host:port[/base]` without a trailing `/`.
    endpoint: str
    page_size: Optional[int]

    def url(self, path: str) -> str:
        return self.endpoint + path

    def instance_url(self, instance_id: str) -> str:
        return self.url(f"/v1/instances/{encode_component(instance_id)}")

    def create(self, spec: t.CreateSpec) -> t.Instance:
        check_label_options(spec.options)
        # Never create outside this pool, whatever the spec says.
        tags = [(k, v) for k, v in spec.tags if k != POOL_TAG]
        tags.append((POOL_TAG, self.pool_id))
        body = {
            "instance_type": spec.instance_type,
            "image": spec.image,
            "tags": tag_object(tags),
            # berth's create token is the idempotency key: a create tried
            # twice makes one instance.
            "client_token": spec.token,
        }
        if spec.user_data is not None:
            body["user_data"] = spec.user_data
        if spec.ssh_public_key is not None:
            body["ssh_public_key"] = spec.ssh_public_key
        resp = request("POST", self.url("/v1/instances"), body)
        if resp.status in (200, 201):
            return decode(resp, sim_api.instance)
        fail(api_error(resp, spec.instance_type))

    def get(self, ids: List[str]) -> List[t.Instance]:
        if not ids:
            return []
        # One list of these ids: the host asks for at most 100, which one
        # page of the largest size holds.
        query = f"tag:{POOL_TAG}={encode_component(self.pool_id)}&page_size={MAX_PAGE_SIZE}"
        query += "".join(f"&id={encode_component(i)}" for i in ids)
        resp = request("GET", self.url(f"/v1/instances?{query}"))
        if resp.status != 200:
            fail(api_error(resp, None))
        page = decode(resp, sim_api.instance_page)
        return only_ids(page.instances, ids, self.pool_id)

    def list(self, filter: Tags, cursor: Optional[str]) -> t.Page:
        # A filter naming another pool matches nothing this driver may see.
        if any(k == POOL_TAG and v != self.pool_id for k, v in filter):
            return t.Page(instances=[], next=None)
        query = f"tag:{POOL_TAG}={encode_component(self.pool_id)}"
        for k, v in filter:
            if k != POOL_TAG:
                query += f"&tag:{encode_component(k)}={encode_component(v)}"
        if self.page_size is not None:
            query += f"&page_size={self.page_size}"
        # One page a call: the host asks for the next with `next`.
        if cursor is not None:
            query += f"&page_token={encode_component(cursor)}"
        resp = request("GET", self.url(f"/v1/instances?{query}"))
        if resp.status != 200:
            fail(api_error(resp, None))
        page = decode(resp, sim_api.instance_page)
        # A token that does not move would have the host loop.
        if page.next_page_token is not None and page.next_page_token == cursor:
            fail(transient(f"sim repeated page token {json.dumps(cursor)}"))
        # The sim filters already; checking again costs nothing and keeps
        # the rule that only this pool's instances are ever shown.
        wanted = [*filter, (POOL_TAG, self.pool_id)]
        instances = [i for i in page.instances if has_all(i.tags, wanted)]
        return t.Page(instances=instances, next=page.next_page_token)

    def delete(self, instance_id: str) -> None:
        # The host only deletes ids it listed through this driver, so they
        # carry the pool tag; the sim has no conditional delete to check it.
        resp = request("DELETE", self.instance_url(instance_id))
        if resp.status not in (200, 202, 204):
            # 404 becomes not-found, which the host counts as already gone.
            fail(api_error(resp, None))

    def set_tags(self, instance_id: str, new: Tags) -> None:
        if any(k == POOL_TAG and v != self.pool_id for k, v in new):
            fail(permanent("set-tags cannot move an instance to another pool"))
        # Only berth tags are replaced (the sim keeps the others); the pool
        # tag always stays.
        tags = [(k, v) for k, v in new if is_berth_tag(k) and k != POOL_TAG]
        tags.append((POOL_TAG, self.pool_id))
        resp = request("PUT", self.instance_url(instance_id) + "/tags", {"tags": tag_object(tags)})
        if resp.status not in (200, 204):
            fail(api_error(resp, None))

    def limits(self) -> t.AccountLimits:
        resp = request("GET", self.url("/v1/limits"))
        if resp.status != 200:
            fail(api_error(resp, None))
        return decode(resp, sim_api.account_limits)


def describe() -> t.DriverInfo:
    return t.DriverInfo(
        name=NAME,
        version=VERSION,
        description="Machines on berth's simulated cloud (`berth sim`), from a driver "
        "written in Python: for tests, and as the example to start a Python driver from.",
        config=[
            t.ConfigField(
                name="endpoint",
                field_type=t.FieldType.STRING,
                required=True,
                default=None,
                doc="Base URL of the sim, for example `http://127.0.0.1:8600`. Its host "
                "must also be in the provider's allowed hosts.",
            ),
            t.ConfigField(
                name="page_size",
                field_type=t.FieldType.INTEGER,
                required=False,
                default=None,
                doc="Instances per list page, 1 to 1000; absent uses the sim's default (100).",
            ),
        ],
        label_options=[],
        capabilities=t.Capabilities.ACCOUNT_LIMITS
        | t.Capabilities.IDEMPOTENT_CREATE
        | t.Capabilities.USER_DATA
        | t.Capabilities.SSH_KEYS,
    )


def configure(pool_id: str, config: str) -> Sim:
    """Validates the provider config into a `Sim`, or fails with
    `invalid-config` naming every problem at once."""
    try:
        raw = json.loads(config)
    except ValueError as e:
        fail(invalid_config(f"provider config: {e}"))
    if not isinstance(raw, dict):
        fail(invalid_config("provider config: must be a JSON object"))
    problems = [
        f"provider config: unknown field {json.dumps(key)}"
        for key in raw
        if key not in ("endpoint", "page_size")
    ]
    endpoint = raw.get("endpoint")
    if not isinstance(endpoint, str):
        problems.append("endpoint: required" if endpoint is None else "endpoint: must be a string")
        endpoint = ""
    else:
        endpoint = endpoint.rstrip("/")
        try:
            if "?" in parse_url(endpoint).path_and_query:
                problems.append("endpoint: must not have a query")
        except ValueError as e:
            problems.append(f"endpoint: {e}")
    page_size = raw.get("page_size")
    if page_size is not None and not (
        sim_api.is_int(page_size) and 1 <= page_size <= MAX_PAGE_SIZE
    ):
        problems.append(f"page_size: must be an integer between 1 and {MAX_PAGE_SIZE}")
    if not pool_id:
        problems.append("pool id: must not be empty")
    if problems:
        fail(invalid_config("; ".join(problems)))
    return Sim(pool_id=pool_id, endpoint=endpoint, page_size=page_size)


def check_label_options(options: str) -> None:
    """The sim takes no label options: `{}` only, and any key is named back."""
    try:
        value = json.loads(options)
    except ValueError as e:
        fail(invalid_config(f"label options: {e}"))
    if not isinstance(value, dict):
        fail(invalid_config("label options: must be a JSON object"))
    for key in value:
        fail(invalid_config(f"label options: unknown option {json.dumps(key)}"))


def request(method: str, url: str, body: Any = None) -> Response:
    """Sends one request; no response at all (refused by the sandbox,
    connection refused, DNS) is a `transient` error."""
    headers = []
    data = None
    if body is not None:
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        headers.append(("content-type", "application/json"))
    try:
        return send(method, url, data, headers)
    except HttpError as e:
        fail(transient(str(e)))


def decode(resp: Response, convert: Callable[[Any], T]) -> T:
    """The body as JSON, converted; a body that is not what the sim sends
    is a `transient` error, as in the Rust SDK."""
    try:
        return convert(json.loads(resp.body))
    except ValueError as e:
        fail(transient(f"response: status {resp.status}: bad json: {e}"))


def api_error(resp: Response, instance_type: Optional[str]) -> t.Error:
    """Turns a failed sim response into the contract's error: the one place
    the sim's statuses and codes are mapped. The sim's own codes and wait
    come first; every other status gets the SDK's usual case."""
    try:
        body = sim_api.api_error(json.loads(resp.body))
    except ValueError:
        body = sim_api.ApiError()
    message = body.message or f"sim answered {resp.status}: {resp.text()[:200]}"
    status, code = resp.status, body.code
    if status == 429 and body.retry_after_ms is not None:
        return errors.rate_limited(body.retry_after_ms, message)
    if status == 403 and code == "quota_exceeded":
        return errors.quota_exceeded(message)
    if status == 503 and code == "insufficient_capacity":
        itype = body.instance_type or instance_type
        if itype is None:
            return errors.capacity_general(message)
        return errors.capacity_for_type(itype, message)
    # 429 waits as Retry-After says (1 s without it), 401 and 403 are
    # unauthorized, 404 not-found, 5xx transient, the rest permanent.
    return errors.from_response(resp, message)


def tag_object(tags: Tags) -> dict:
    """Tags as the sim's JSON object, sorted by key; a later duplicate key wins."""
    return dict(sorted(dict(tags).items()))


# What `configure` returned in this instance of the component. It lives as
# long as the instance, like the value the Rust SDK keeps; nothing else is
# kept between calls (the host may run several instances side by side).
_configured: Optional[Sim] = None


def configured() -> Sim:
    if _configured is None:
        fail(invalid_config("driver not configured"))
    return _configured


class Driver(Defaults, exports.Driver):
    """The `berth:driver/driver` export. `Defaults` answers `create_many`
    and `delete_many` as not supported: `describe` declares neither
    capability, so the host calls `create` and `delete` once per instance."""

    def describe(self) -> t.DriverInfo:
        return describe()

    def configure(self, pool_id: str, config: str) -> None:
        global _configured
        _configured = configure(pool_id, config)

    def create(self, spec: t.CreateSpec) -> t.Instance:
        return configured().create(spec)

    def get(self, ids: List[str]) -> List[t.Instance]:
        return configured().get(ids)

    def list(self, filter: Tags, cursor: Optional[str]) -> t.Page:
        return configured().list(filter, cursor)

    def delete(self, instance_id: str) -> None:
        configured().delete(instance_id)

    def set_tags(self, instance_id: str, tags: Tags) -> None:
        configured().set_tags(instance_id, tags)

    def limits(self) -> t.AccountLimits:
        return configured().limits()
