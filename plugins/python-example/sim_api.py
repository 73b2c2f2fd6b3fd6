"""The sim's wire format (docs/sim-cloud.md) and its conversion to the
contract's types. Responses are read leniently (unknown fields ignored,
absent optional ones defaulted) so a newer sim does not break an older
driver; a field of the wrong type is a `ValueError`.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from wit_world.imports import berth_driver_types as t

_STATES = {
    "pending": t.InstanceState_Pending,
    "running": t.InstanceState_Running,
    "stopping": t.InstanceState_Stopping,
    "terminated": t.InstanceState_Terminated,
}

U16_MAX = 2**16 - 1
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1


def instance(obj: Any) -> t.Instance:
    """One instance as the sim reports it, as the contract's `instance`."""
    obj = _object(obj, "instance")
    tags = _object(obj.get("tags") or {}, "tags")
    for key, value in tags.items():
        _string(value, f"tags.{key}")
    return t.Instance(
        id=_string(obj.get("id"), "id"),
        state=state(obj),
        instance_type=_string(obj.get("instance_type"), "instance_type"),
        # Sorted by key, as the Rust driver reports them.
        tags=sorted(tags.items()),
        addresses=t.Addresses(
            public_ipv4=_optional_string(obj, "public_ipv4"),
            private_ipv4=_optional_string(obj, "private_ipv4"),
            ipv6=None,
            hostname=_optional_string(obj, "hostname"),
        ),
        created_at_ms=_optional_int(obj, "created_at_ms", U64_MAX),
        connection=t.Connection(
            username=_optional_string(obj, "username"),
            port=_optional_int(obj, "ssh_port", U16_MAX),
            host_keys=[],
        ),
    )


def state(obj: Dict[str, Any]) -> t.InstanceState:
    """The sim's `state` as the contract's: `failed` carries the sim's
    `fault`, why the instance will never run."""
    text = _string(obj.get("state"), "state")
    if text == "failed":
        return t.InstanceState_Failed(_optional_string(obj, "fault") or "")
    return _STATES.get(text, t.InstanceState_Unknown)()


@dataclass
class InstancePage:
    """`GET /v1/instances`."""

    instances: List[t.Instance]
    next_page_token: Optional[str]


def instance_page(obj: Any) -> InstancePage:
    obj = _object(obj, "page")
    items = obj.get("instances")
    if not isinstance(items, list):
        raise ValueError("instances: expected a list")
    return InstancePage(
        instances=[instance(i) for i in items],
        next_page_token=_optional_string(obj, "next_page_token"),
    )


def account_limits(obj: Any) -> t.AccountLimits:
    """`GET /v1/limits` as the contract's `account-limits`."""
    obj = _object(obj, "limits")
    return t.AccountLimits(
        max_instances=_optional_int(obj, "max_instances", U32_MAX),
        max_cores=None,
        max_ram_mib=None,
        used_instances=_optional_int(obj, "used_instances", U32_MAX),
        used_cores=None,
        used_ram_mib=None,
    )


@dataclass
class ApiError:
    """The body of every sim error, `{"error": {"code", "message"}, ...}`;
    fields that are absent or malformed are left empty."""

    code: str = ""
    message: str = ""
    # With 429.
    retry_after_ms: Optional[int] = None
    # With 503 `insufficient_capacity`.
    instance_type: Optional[str] = None


def api_error(obj: Any) -> ApiError:
    if not isinstance(obj, dict):
        return ApiError()
    detail = obj.get("error")
    detail = detail if isinstance(detail, dict) else {}
    code, message = detail.get("code"), detail.get("message")
    retry, itype = obj.get("retry_after_ms"), obj.get("instance_type")
    return ApiError(
        code=code if isinstance(code, str) else "",
        message=message if isinstance(message, str) else "",
        retry_after_ms=retry if is_int(retry) and 0 <= retry <= U64_MAX else None,
        instance_type=itype if isinstance(itype, str) else None,
    )


def is_int(value: Any) -> bool:
    # `bool` is a subclass of `int` in Python; JSON `true` is not a number.
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value: Any, what: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected an object")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a string")
    return value


def _optional_string(obj: Dict[str, Any], key: str) -> Optional[str]:
    value = obj.get(key)
    return None if value is None else _string(value, key)


def _optional_int(obj: Dict[str, Any], key: str, most: int) -> Optional[int]:
    value = obj.get(key)
    if value is None:
        return None
    if not is_int(value) or not 0 <= value <= most:
        raise ValueError(f"{key}: expected an integer from 0 to {most}")
    return value
