"""Makes the SDK importable by its tests, on plain CPython.

Every test module imports this first. It puts the SDK's source folder first
on `sys.path`, and, unless the stubs `componentize-py bindings` writes are
on the path already, stands in for the few parts of them the SDK's tests
use: `componentize_py_types`, and in `wit_world.imports` the contract's
error, instance and page types (`berth_driver_types`), `log` and `auth`. They are shaped like
componentize-py's (dataclasses, one class per variant case), so the same
tests pass against the real stubs:

    componentize-py -d wit -w berth:driver/driver-plugin bindings BINDINGS
    PYTHONPATH=BINDINGS python -m unittest discover -s sdk/python/tests
"""

import sys
import types
from dataclasses import dataclass
from enum import Enum
from importlib.util import find_spec
from pathlib import Path
from typing import Generic, List, Optional, Tuple, TypeVar, Union

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Whether the tests run against componentize-py's own stubs.
REAL_BINDINGS = find_spec("wit_world") is not None

S = TypeVar("S")
T = TypeVar("T")
E = TypeVar("E")


@dataclass
class Some(Generic[S]):
    value: S


@dataclass
class Ok(Generic[T]):
    value: T


@dataclass(frozen=True)
class Err(Generic[E], Exception):
    value: E


@dataclass
class RateLimit:
    retry_after_ms: int
    message: str


@dataclass
class CapacityScope_InstanceType:
    value: str


@dataclass
class CapacityScope_General:
    pass


@dataclass
class Capacity:
    scope: Union[CapacityScope_InstanceType, CapacityScope_General]
    message: str


@dataclass
class Error_RateLimited:
    value: RateLimit


@dataclass
class Error_QuotaExceeded:
    value: str


@dataclass
class Error_Capacity:
    value: Capacity


@dataclass
class Error_NotFound:
    value: str


@dataclass
class Error_Unauthorized:
    value: str


@dataclass
class Error_InvalidConfig:
    value: str


@dataclass
class Error_Transient:
    value: str


@dataclass
class Error_Permanent:
    value: str


@dataclass
class InstanceState_Pending:
    pass


@dataclass
class InstanceState_Running:
    pass


@dataclass
class InstanceState_Stopping:
    pass


@dataclass
class InstanceState_Terminated:
    pass


@dataclass
class InstanceState_Failed:
    value: str


@dataclass
class InstanceState_Unknown:
    pass


@dataclass
class Addresses:
    public_ipv4: Optional[str]
    private_ipv4: Optional[str]
    ipv6: Optional[str]
    hostname: Optional[str]


@dataclass
class Connection:
    username: Optional[str]
    port: Optional[int]
    host_keys: List[str]


@dataclass
class Instance:
    id: str
    state: object
    instance_type: str
    tags: List[Tuple[str, str]]
    addresses: Addresses
    created_at_ms: Optional[int]
    connection: Connection


@dataclass
class Page:
    instances: List[Instance]
    next: Optional[str]


class Level(Enum):
    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


def log(level: Level, message: str, fields: List[Tuple[str, str]]) -> None:
    raise NotImplementedError


def auth_info(host: str) -> Optional[str]:
    raise NotImplementedError


def _module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _install() -> None:
    _module("componentize_py_types", Some=Some, Ok=Ok, Err=Err, Result=Union[Ok, Err])
    error_cases = [
        Error_RateLimited, Error_QuotaExceeded, Error_Capacity, Error_NotFound,
        Error_Unauthorized, Error_InvalidConfig, Error_Transient, Error_Permanent,
    ]
    states = [
        InstanceState_Pending, InstanceState_Running, InstanceState_Stopping,
        InstanceState_Terminated, InstanceState_Failed, InstanceState_Unknown,
    ]
    contract = _module(
        "wit_world.imports.berth_driver_types",
        Addresses=Addresses,
        Connection=Connection,
        Instance=Instance,
        InstanceState=Union[tuple(states)],
        Page=Page,
        **{state.__name__: state for state in states},
        RateLimit=RateLimit,
        Capacity=Capacity,
        CapacityScope_InstanceType=CapacityScope_InstanceType,
        CapacityScope_General=CapacityScope_General,
        CapacityScope=Union[CapacityScope_InstanceType, CapacityScope_General],
        Error=Union[tuple(error_cases)],
        **{case.__name__: case for case in error_cases},
    )
    logging = _module("wit_world.imports.log", Level=Level, log=log)
    credentials = _module("wit_world.imports.auth", auth_info=auth_info)
    imports = _module(
        "wit_world.imports", berth_driver_types=contract, log=logging, auth=credentials
    )
    _module("wit_world", imports=imports)


if not REAL_BINDINGS:
    _install()
