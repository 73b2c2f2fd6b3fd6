"""Unit tests of the driver's pure parts, run on the build machine's Python
by `build` against the bindings componentize-py generates (whose types are
real and whose host functions raise `NotImplementedError`); HTTP is replaced
by a fake `send`. The conformance kit tests the built component.
"""

import json
import unittest
from typing import List, Optional, Tuple
from unittest import mock

from componentize_py_types import Err
from wit_world.imports import berth_driver_types as t

import app
import sim_api
from wasi_http_client import HttpError, Response, encode_component, parse_url


def resp(status: int, body: object = None, headers: List[Tuple[str, str]] = []) -> Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Response(status, headers, data)


def err_body(code: str, **extra: object) -> dict:
    return {"error": {"code": code, "message": "m"}, **extra}


def sim_instance(id: str, tags: dict, state: str = "pending") -> dict:
    return {"id": id, "state": state, "instance_type": "small", "tags": tags}


class FakeCloud:
    """Answers `send` from a list of responses and records every request."""

    def __init__(self, *responses: Response):
        self.responses = list(responses)
        self.requests: List[Tuple[str, str, Optional[object]]] = []

    def __call__(self, method: str, url: str, body: Optional[bytes] = None, headers=()) -> Response:
        self.requests.append((method, url, None if body is None else json.loads(body)))
        return self.responses.pop(0)


def error_of(call) -> t.Error:
    try:
        call()
    except Err as e:
        return e.value
    raise AssertionError("no error")


SIM = app.Sim(pool_id="p1", endpoint="http://sim", page_size=None)


class ApiErrors(unittest.TestCase):
    def check(self, response: Response, want: t.Error, instance_type: Optional[str] = None):
        self.assertEqual(app.api_error(response, instance_type), want)

    def test_maps_sim_errors(self):
        rate = lambda ms, m="m": t.Error_RateLimited(t.RateLimit(retry_after_ms=ms, message=m))
        retry_3s = [("retry-after", "3")]
        self.check(resp(429, err_body("rate_limited", retry_after_ms=2500), retry_3s), rate(2500))
        self.check(resp(429, err_body("rate_limited"), retry_3s), rate(3000))
        self.check(resp(429, b"not json"), rate(1000, "sim answered 429: not json"))
        self.check(resp(429, err_body("rate_limited"), [("retry-after", "-2")]), rate(1000))
        self.check(resp(403, err_body("quota_exceeded")), t.Error_QuotaExceeded("m"))
        self.check(
            resp(503, err_body("insufficient_capacity", instance_type="gpu")),
            t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("gpu"), "m")),
            "small",
        )
        self.check(
            resp(503, err_body("insufficient_capacity")),
            t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("small"), "m")),
            "small",
        )
        self.check(
            resp(503, err_body("insufficient_capacity")),
            t.Error_Capacity(t.Capacity(t.CapacityScope_General(), "m")),
        )
        self.check(resp(503, b"down"), t.Error_Transient("sim answered 503: down"))
        self.check(resp(404, err_body("not_found")), t.Error_NotFound("m"))
        self.check(resp(401, err_body("unauthorized")), t.Error_Unauthorized("m"))
        self.check(resp(403, err_body("forbidden")), t.Error_Unauthorized("m"))
        self.check(resp(400, err_body("invalid_request")), t.Error_Permanent("m"))
        self.check(resp(500, err_body("internal_error")), t.Error_Transient("m"))


class Configure(unittest.TestCase):
    def test_accepts_and_trims(self):
        sim = app.configure("p1", '{"endpoint": "http://127.0.0.1:8600/", "page_size": 5}')
        self.assertEqual(sim, app.Sim("p1", "http://127.0.0.1:8600", 5))
        sim = app.configure("p1", '{"endpoint": "https://h/base", "page_size": null}')
        self.assertEqual(sim, app.Sim("p1", "https://h/base", None))

    def test_names_every_problem(self):
        for config, needles in [
            ("{}", ["endpoint"]),
            ("not json", ["provider config"]),
            ("[]", ["provider config"]),
            ('{"endpoint": 7}', ["endpoint"]),
            ('{"endpoint": "ftp://x"}', ["endpoint", "scheme"]),
            ('{"endpoint": "127.0.0.1:80"}', ["endpoint"]),
            ('{"endpoint": "http://h?x=1"}', ["endpoint", "query"]),
            ('{"endpoint": "http://h", "page_size": 0}', ["page_size"]),
            ('{"endpoint": "http://h", "page_size": 1001}', ["page_size"]),
            ('{"endpoint": "http://h", "page_size": true}', ["page_size"]),
            ('{"endpoint": "http://h", "colour": 1}', ["colour"]),
            ('{"colour": 1, "page_size": "x"}', ["colour", "endpoint", "page_size"]),
        ]:
            e = error_of(lambda: app.configure("p1", config))
            self.assertIsInstance(e, t.Error_InvalidConfig, config)
            for needle in needles:
                self.assertIn(needle, e.value, config)
        e = error_of(lambda: app.configure("", '{"endpoint": "http://h"}'))
        self.assertEqual(e, t.Error_InvalidConfig("pool id: must not be empty"))

    def test_calls_before_configure_fail(self):
        with mock.patch.object(app, "_configured", None):
            e = error_of(lambda: app.Driver().list([]))
        self.assertEqual(e, t.Error_InvalidConfig("driver not configured"))


class LabelOptions(unittest.TestCase):
    def test_only_empty_object(self):
        app.check_label_options("{}")
        e = error_of(lambda: app.check_label_options('{"zone": "a"}'))
        self.assertIsInstance(e, t.Error_InvalidConfig)
        self.assertIn("zone", e.value)
        e = error_of(lambda: app.check_label_options("[]"))
        self.assertIsInstance(e, t.Error_InvalidConfig)


class Instances(unittest.TestCase):
    def test_instance_from_sim_json(self):
        i = sim_api.instance(
            {
                "id": "i-2a", "state": "pending", "instance_type": "small", "image": "ubuntu-24.04",
                "tags": {"berth-pool": "p1", "berth-node": "n-1"}, "created_at_ms": 1790000000000,
                "private_ipv4": "10.0.0.42", "public_ipv4": None, "hostname": "i-2a.sim.internal",
                "ssh_port": 22, "username": "berth", "client_token": "n-1",
            }
        )
        self.assertEqual(
            i,
            t.Instance(
                id="i-2a",
                state=t.InstanceState.PENDING,
                instance_type="small",
                tags=[("berth-node", "n-1"), ("berth-pool", "p1")],
                addresses=t.Addresses(None, "10.0.0.42", None, "i-2a.sim.internal"),
                created_at_ms=1790000000000,
                connection=t.Connection("berth", 22, []),
            ),
        )

    def test_states(self):
        for text, want in [
            ("pending", t.InstanceState.PENDING),
            ("running", t.InstanceState.RUNNING),
            ("stopping", t.InstanceState.STOPPING),
            ("terminated", t.InstanceState.TERMINATED),
            ("exploded", t.InstanceState.UNKNOWN),
        ]:
            self.assertEqual(sim_api.instance(sim_instance("i-1", {}, text)).state, want)

    def test_malformed_is_transient(self):
        for body in [
            b"{",
            {"id": 1, "state": "pending", "instance_type": "t"},
            {"id": "i", "state": "pending"},
            {**sim_instance("i", {}), "ssh_port": 70000},
            {**sim_instance("i", {}), "created_at_ms": True},
        ]:
            e = error_of(lambda: app.decode(resp(201, body), sim_api.instance))
            self.assertIsInstance(e, t.Error_Transient, body)
            self.assertIn("bad json", e.value)


class Calls(unittest.TestCase):
    def test_create_forces_pool_tag_and_token(self):
        cloud = FakeCloud(resp(201, sim_instance("i-1", {"berth-pool": "p1"})))
        tags = [("berth-pool", "other"), ("berth-node", "n-1")]
        spec = t.CreateSpec("n-1", "small", "img", tags, None, "ssh-ed25519 k", "{}")
        with mock.patch.object(app, "send", cloud):
            self.assertEqual(SIM.create(spec).id, "i-1")
        self.assertEqual(
            cloud.requests,
            [("POST", "http://sim/v1/instances", {
                "instance_type": "small",
                "image": "img",
                "tags": {"berth-node": "n-1", "berth-pool": "p1"},
                "client_token": "n-1",
                "ssh_public_key": "ssh-ed25519 k",
            })],
        )

    def test_create_capacity_names_the_type(self):
        cloud = FakeCloud(resp(503, err_body("insufficient_capacity")))
        spec = t.CreateSpec("n-1", "big", "img", [], None, None, "{}")
        with mock.patch.object(app, "send", cloud):
            e = error_of(lambda: SIM.create(spec))
        self.assertEqual(e, t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("big"), "m")))

    def test_no_response_is_transient(self):
        def refused(*args, **kwargs):
            raise HttpError("request failed: HttpRequestDenied")

        with mock.patch.object(app, "send", refused):
            e = error_of(lambda: SIM.delete("i-1"))
        self.assertEqual(e, t.Error_Transient("request failed: HttpRequestDenied"))

    def test_list_follows_pages_and_filters(self):
        mine = sim_instance("i-1", {"berth-pool": "p1", "berth-label": "a b"})
        stray = sim_instance("i-2", {"berth-pool": "p2", "berth-label": "a b"})
        cloud = FakeCloud(
            resp(200, {"instances": [mine], "next_page_token": "t/1"}),
            resp(200, {"instances": [stray], "next_page_token": None}),
        )
        sim = app.Sim("p1", "http://sim", 1)
        with mock.patch.object(app, "send", cloud):
            got = sim.list([("berth-pool", "p1"), ("berth-label", "a b")])
        self.assertEqual([i.id for i in got], ["i-1"])
        query = "tag:berth-pool=p1&tag:berth-label=a%20b&page_size=1"
        self.assertEqual(
            [url for _, url, _ in cloud.requests],
            [
                f"http://sim/v1/instances?{query}",
                f"http://sim/v1/instances?{query}&page_token=t%2F1",
            ],
        )

    def test_list_of_foreign_pool_asks_nothing(self):
        cloud = FakeCloud()
        with mock.patch.object(app, "send", cloud):
            self.assertEqual(SIM.list([("berth-pool", "p2")]), [])
        self.assertEqual(cloud.requests, [])

    def test_list_repeated_token_is_transient(self):
        page = resp(200, {"instances": [], "next_page_token": "x"})
        with mock.patch.object(app, "send", FakeCloud(page, page)):
            self.assertIsInstance(error_of(lambda: SIM.list([])), t.Error_Transient)

    def test_delete_not_found(self):
        with mock.patch.object(app, "send", FakeCloud(resp(404, err_body("not_found")))):
            self.assertEqual(error_of(lambda: SIM.delete("i-1")), t.Error_NotFound("m"))

    def test_set_tags_keeps_pool_and_drops_foreign_keys(self):
        cloud = FakeCloud(resp(204, b""))
        with mock.patch.object(app, "send", cloud):
            SIM.set_tags("i/1", [("berth-node", "n-2"), ("name", "x")])
        self.assertEqual(
            cloud.requests,
            [
                (
                    "PUT",
                    "http://sim/v1/instances/i%2F1/tags",
                    {"tags": {"berth-node": "n-2", "berth-pool": "p1"}},
                )
            ],
        )
        e = error_of(lambda: SIM.set_tags("i-1", [("berth-pool", "p2")]))
        self.assertIsInstance(e, t.Error_Permanent)

    def test_limits(self):
        cloud = FakeCloud(resp(200, {"max_instances": None, "used_instances": 3}))
        with mock.patch.object(app, "send", cloud):
            self.assertEqual(SIM.limits(), t.AccountLimits(None, None, None, 3, None, None))


class Urls(unittest.TestCase):
    def test_parse(self):
        for text, want in [
            ("http://127.0.0.1:8080", (False, "127.0.0.1:8080", "/")),
            ("HTTPS://api.example.com/v1/x?a=1&b=2", (True, "api.example.com", "/v1/x?a=1&b=2")),
            ("http://h?x=1", (False, "h", "/?x=1")),
            ("http://h/p#frag", (False, "h", "/p")),
            ("http://[::1]:9000/a", (False, "[::1]:9000", "/a")),
        ]:
            u = parse_url(text)
            self.assertEqual((u.https, u.authority, u.path_and_query), want, text)
        for text, why in [
            ("ftp://h/", "scheme must be http or https"),
            ("127.0.0.1:8080", "not an absolute url"),
            ("http:///path", "no host"),
            ("http://user:pw@h/", "user info"),
            ("http://h:notaport/", "bad port"),
            ("http://h:99999/", "bad port"),
            ("http://h:/", "bad port"),
            ("http://[::1/", "unclosed"),
            ("http://::1/", "brackets"),
            ("http://h/a b", "whitespace"),
        ]:
            with self.assertRaisesRegex(ValueError, why, msg=text):
                parse_url(text)

    def test_encode(self):
        self.assertEqual(encode_component("berth-pool"), "berth-pool")
        self.assertEqual(encode_component("a b/c?d=e&f"), "a%20b%2Fc%3Fd%3De%26f")
        self.assertEqual(encode_component("é"), "%C3%A9")
        self.assertEqual(encode_component("A-z_0.9~"), "A-z_0.9~")


if __name__ == "__main__":
    unittest.main()
