"""{{name}}: a berth driver written in Python.

As generated, it drives the instance API of berth's simulated cloud
(`berth sim`), so it builds, passes `berth driver check` and passes
`berth driver test` against a running sim before you change a line. Every
place that speaks the sim's API is marked `CLOUD:`; replace those with your
cloud's calls and JSON, and keep the rest.

componentize-py exports the class named after the WIT interface, `Driver`.
A call returns one of the contract's errors with `fail(error)`; any other
exception traps, and the host replaces the instance. HTTP, errors, tags and
the helpers for `get` and `list` come from the SDK, `berth_driver`; its
`Defaults` answers the batch calls (`create_many`, `delete_many`) as not
supported, which is right for a driver that does not declare them.
"""

import json
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple, TypeVar

from berth_driver import errors
from berth_driver.driver import Defaults
from berth_driver.errors import fail, invalid_config, transient
from berth_driver.http import HttpError, Response, encode_component, parse_url, send
from berth_driver.pages import only_ids
from berth_driver.tags import POOL_TAG, Tags, has_all, is_berth_tag
from wit_world import exports
from wit_world.imports import berth_driver_types as t

NAME = "{{name}}"
VERSION = "0.1.0"

# CLOUD: the largest page your cloud's list call returns.
MAX_PAGE_SIZE = 1000

T = TypeVar("T")


def describe() -> t.DriverInfo:
    return t.DriverInfo(
        name=NAME,
        version=VERSION,
        # CLOUD: say which cloud this driver manages.
        description="Machines on berth's simulated cloud (`berth sim`).",
        config=[
            t.ConfigField(
                name="endpoint",
                field_type=t.FieldType.STRING,
                required=True,
                default=None,
                doc="Base URL of the cloud's API, for example `http://127.0.0.1:8181`. "
                "Its host must also be in the provider's allowed hosts.",
            ),
            t.ConfigField(
                name="page_size",
                field_type=t.FieldType.INTEGER,
                required=False,
                default=None,
                doc=f"Instances per list page, 1 to {MAX_PAGE_SIZE}; absent: the cloud's default.",
            ),
        ],
        label_options=[],
        # Declare USER_DATA and SSH_KEYS too once `create` passes them on.
        capabilities=t.Capabilities.IDEMPOTENT_CREATE | t.Capabilities.ACCOUNT_LIMITS,
    )


@dataclass(frozen=True)
class Cloud:
    """The configured driver: what `configure` accepted, nothing more."""

    pool_id: str
    endpoint: str  # without a trailing `/`
    page_size: Optional[int]

    def instance_url(self, instance_id: str) -> str:
        return f"{self.endpoint}/v1/instances/{encode_component(instance_id)}"

    def create(self, spec: t.CreateSpec) -> t.Instance:
        # `describe` declares no label options, so `{}` is all it accepts.
        if loads(spec.options, "label options") != {}:
            fail(invalid_config(f"label options: this driver takes none, got {spec.options}"))
        tags = dict(spec.tags)
        tags[POOL_TAG] = self.pool_id  # never create outside this pool
        # CLOUD: your cloud's create call.
        body = {
            "instance_type": spec.instance_type,
            "image": spec.image,
            "tags": tags,
            # berth's create token is the idempotency key: a create tried
            # twice makes one instance.
            "client_token": spec.token,
        }
        resp = request("POST", f"{self.endpoint}/v1/instances", body)
        if resp.status not in (200, 201):
            fail(api_error(resp, spec.instance_type))
        return read(resp, to_instance)

    def get(self, ids: List[str]) -> List[t.Instance]:
        if not ids:
            return []
        # CLOUD: a lookup of just these ids (a filter by id, or one call
        # each), never a list of everything. The host asks for at most 100,
        # which one page of the largest size holds.
        query = f"tag:{POOL_TAG}={encode_component(self.pool_id)}&page_size={MAX_PAGE_SIZE}"
        query += "".join(f"&id={encode_component(i)}" for i in ids)
        resp = request("GET", f"{self.endpoint}/v1/instances?{query}")
        if resp.status != 200:
            fail(api_error(resp))
        found, _ = read(resp, to_page)
        # Only the ids asked, and only this pool's.
        return only_ids(found, ids, self.pool_id)

    def list(self, filter: Tags, cursor: Optional[str]) -> t.Page:
        # A filter naming another pool matches nothing this driver may see.
        if any(k == POOL_TAG and v != self.pool_id for k, v in filter):
            return t.Page(instances=[], next=None)
        wanted = [(POOL_TAG, self.pool_id), *((k, v) for k, v in filter if k != POOL_TAG)]
        # CLOUD: your cloud's list call, filtered by tag on the cloud's side
        # where it can. One page per call: the host asks for the next one
        # with the cursor given back in `next`.
        query = "&".join(f"tag:{encode_component(k)}={encode_component(v)}" for k, v in wanted)
        if self.page_size is not None:
            query += f"&page_size={self.page_size}"
        if cursor is not None:
            query += f"&page_token={encode_component(cursor)}"
        resp = request("GET", f"{self.endpoint}/v1/instances?{query}")
        if resp.status != 200:
            fail(api_error(resp))
        found, next_token = read(resp, to_page)
        if next_token is not None and next_token == cursor:  # the host would loop
            fail(transient(f"list: the cloud repeated page token {next_token!r}"))
        # Only this pool's instances, and only those with every filter tag.
        return t.Page(instances=[i for i in found if has_all(i.tags, wanted)], next=next_token)

    def delete(self, instance_id: str) -> None:
        # CLOUD: your cloud's delete call.
        resp = request("DELETE", self.instance_url(instance_id))
        if not resp.is_success():
            # 404 becomes not-found, which the host counts as already gone.
            fail(api_error(resp))

    def set_tags(self, instance_id: str, tags: Tags) -> None:
        if any(k == POOL_TAG and v != self.pool_id for k, v in tags):
            fail(errors.permanent("set-tags cannot move an instance to another pool"))
        # Only berth's tags are replaced, and the pool tag always stays.
        new = {k: v for k, v in tags if is_berth_tag(k)}
        new[POOL_TAG] = self.pool_id
        # CLOUD: the sim replaces every `berth-` tag and keeps the others. On a
        # cloud that only adds and removes tags, read the instance's tags and
        # compute the result with `berth_driver.tags.replace_berth_tags`.
        resp = request("PUT", self.instance_url(instance_id) + "/tags", {"tags": new})
        if not resp.is_success():
            fail(api_error(resp))

    def limits(self) -> t.AccountLimits:
        # CLOUD: your cloud's quota and usage call.
        resp = request("GET", f"{self.endpoint}/v1/limits")
        if resp.status != 200:
            fail(api_error(resp))
        return read(resp, to_limits)


def configure(pool_id: str, config: str) -> Cloud:
    """The provider config, checked: `invalid-config` names every wrong field at once."""
    raw = loads(config, "provider config")
    if not isinstance(raw, dict):
        fail(invalid_config("provider config: must be a JSON object"))
    problems = [f"{key}: unknown field" for key in raw if key not in ("endpoint", "page_size")]
    endpoint = raw.get("endpoint")
    if not isinstance(endpoint, str):
        problems.append("endpoint: required, a URL")
        endpoint = ""
    else:
        endpoint = endpoint.rstrip("/")
        try:
            if "?" in parse_url(endpoint).path_and_query:
                problems.append("endpoint: must not have a query")
        except ValueError as e:
            problems.append(f"endpoint: {e}")
    page_size = raw.get("page_size")
    if page_size is not None and not (is_int(page_size) and 1 <= page_size <= MAX_PAGE_SIZE):
        problems.append(f"page_size: must be an integer from 1 to {MAX_PAGE_SIZE}")
    if not pool_id:
        problems.append("pool id: must not be empty")
    if problems:
        fail(invalid_config("; ".join(problems)))
    return Cloud(pool_id=pool_id, endpoint=endpoint, page_size=page_size)


def api_error(resp: Response, instance_type: Optional[str] = None) -> t.Error:
    """How a failed response becomes the contract's error.

    CLOUD: the sim names its failures in the body, `{"error": {"code",
    "message"}}`. Check your cloud's own codes first (a quota, no capacity,
    a 403 that means a quota), then let the SDK map the status: 429
    rate-limited for as long as `Retry-After` says, 401 and 403
    unauthorized, 404 not-found, 5xx transient, the rest permanent."""
    try:
        detail = json.loads(resp.body)["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "", f"HTTP {resp.status}: {resp.text()[:200]}"
    if resp.status == 403 and code == "quota_exceeded":
        return errors.quota_exceeded(message)
    if resp.status == 503 and code == "insufficient_capacity":
        if instance_type is None:
            return errors.capacity_general(message)
        return errors.capacity_for_type(instance_type, message)
    return errors.from_response(resp, message)


# CLOUD: your cloud's JSON, as the contract's types. A field of the wrong
# type raises ValueError, which `read` turns into a `transient` error.

STATES = {
    "pending": t.InstanceState_Pending,
    "running": t.InstanceState_Running,
    "stopping": t.InstanceState_Stopping,
    "terminated": t.InstanceState_Terminated,
}


def to_state(obj: Any) -> t.InstanceState:
    state = field(obj, "state", str)
    if state == "failed":
        # The cloud gave up on it, and says why; berth replaces it at once.
        return t.InstanceState_Failed(field(obj, "fault", str, optional=True) or "")
    return STATES.get(state, t.InstanceState_Unknown)()


def to_instance(obj: Any) -> t.Instance:
    tags = field(obj, "tags", dict, optional=True) or {}
    return t.Instance(
        id=field(obj, "id", str),
        state=to_state(obj),
        instance_type=field(obj, "instance_type", str),
        # Every tag, verbatim: after a restart they are berth's only record.
        tags=sorted((k, field(tags, k, str)) for k in tags),
        addresses=t.Addresses(
            public_ipv4=field(obj, "public_ipv4", str, optional=True),
            private_ipv4=field(obj, "private_ipv4", str, optional=True),
            ipv6=None,
            hostname=field(obj, "hostname", str, optional=True),
        ),
        created_at_ms=field(obj, "created_at_ms", int, optional=True),
        connection=t.Connection(
            username=field(obj, "username", str, optional=True),
            port=field(obj, "ssh_port", int, optional=True),
            host_keys=[],
        ),
    )


def to_page(obj: Any) -> Tuple[List[t.Instance], Optional[str]]:
    return (
        [to_instance(i) for i in field(obj, "instances", list)],
        field(obj, "next_page_token", str, optional=True),
    )


def to_limits(obj: Any) -> t.AccountLimits:
    return t.AccountLimits(
        max_instances=field(obj, "max_instances", int, optional=True),
        max_cores=None,
        max_ram_mib=None,
        used_instances=field(obj, "used_instances", int, optional=True),
        used_cores=None,
        used_ram_mib=None,
    )


def field(obj: Any, key: str, kind: type, optional: bool = False) -> Any:
    """`obj[key]`, which must be a `kind` (or absent or null, when `optional`)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and not is_int(value)):
        raise ValueError(f"{key}: expected {kind.__name__}")
    if kind is int and value < 0:
        raise ValueError(f"{key}: expected a number of at least 0")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON `true` is no number


def loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        fail(invalid_config(f"{what}: {e}"))


def request(method: str, url: str, body: Any = None) -> Response:
    """Sends one request. No response at all (refused by the sandbox,
    connection refused, DNS) is `transient`; an HTTP error status is a
    normal response, for the caller to map with `api_error`."""
    data = None if body is None else json.dumps(body).encode()
    headers = [] if body is None else [("content-type", "application/json")]
    try:
        return send(method, url, data, headers)
    except HttpError as e:
        fail(transient(str(e)))


def read(resp: Response, convert: Callable[[Any], T]) -> T:
    """The response's JSON body, converted; anything else is `transient`."""
    try:
        return convert(json.loads(resp.body))
    except ValueError as e:
        fail(transient(f"response {resp.status}: unexpected body: {e}"))


# What `configure` returned in this instance of the component. Nothing else
# is kept between calls: the host may run several instances side by side,
# so whatever a call needs is asked of the cloud again.
_configured: Optional[Cloud] = None


def configured() -> Cloud:
    if _configured is None:
        fail(invalid_config("driver not configured"))
    return _configured


class Driver(Defaults, exports.Driver):
    """The `berth:driver/driver` export. `Defaults` answers `create_many`
    and `delete_many`, which the host calls only when `describe` declares
    the `CREATE_MANY` or `DELETE_MANY` capability, as not supported."""

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
