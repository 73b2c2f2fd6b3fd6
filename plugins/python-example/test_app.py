"""Unit tests of the driver's pure parts, run on the build machine's Python
by `build` against the bindings componentize-py generates (whose types are
real and whose host functions raise `NotImplementedError`); HTTP is
`berth_driver.testing.FakeHttp`, which answers the requests the test
queued. The conformance kit tests the built component.
"""

import unittest
from typing import Optional
from unittest import mock

from berth_driver.http import Response
from berth_driver.testing import FakeHttp, error_of, response
from componentize_py_types import Err
from wit_world.imports import berth_driver_types as t

import app
import sim_api


def err_body(code: str, **extra: object) -> dict:
    return {"error": {"code": code, "message": "m"}, **extra}


def sim_instance(id: str, tags: dict, state: str = "pending") -> dict:
    return {"id": id, "state": state, "instance_type": "small", "tags": tags}


TOKEN = "0b3c5d7e-1f2a-4b6c-8d9e-a1b2c3d4e5f6"


def spec(instance_type: str = "small", tags: Optional[list] = None, **more) -> t.CreateSpec:
    """A create as the host asks for it."""
    fields = dict(
        node_id="n-1",
        token=TOKEN,
        instance_type=instance_type,
        image="img",
        tags=tags or [],
        user_data=None,
        ssh_public_key=None,
        options="{}",
    )
    fields.update(more)
    return t.CreateSpec(**fields)


def sent(cloud: FakeHttp) -> list:
    """The requests the driver sent: method, URL and JSON body."""
    return [(r.method, r.url, r.json()) for r in cloud.requests]


SIM = app.Sim(pool_id="p1", endpoint="http://sim", page_size=None)


class ApiErrors(unittest.TestCase):
    def check(self, resp: Response, want: t.Error, instance_type: Optional[str] = None):
        self.assertEqual(app.api_error(resp, instance_type), want)

    def test_maps_sim_errors(self):
        rate = lambda ms, m="m": t.Error_RateLimited(t.RateLimit(retry_after_ms=ms, message=m))
        retry_3s = [("retry-after", "3")]
        self.check(response(429, err_body("rate_limited", retry_after_ms=2500), headers=retry_3s), rate(2500))
        self.check(response(429, err_body("rate_limited"), headers=retry_3s), rate(3000))
        self.check(response(429, body=b"not json"), rate(1000, "sim answered 429: not json"))
        self.check(response(429, err_body("rate_limited"), headers=[("retry-after", "-2")]), rate(1000))
        self.check(response(403, err_body("quota_exceeded")), t.Error_QuotaExceeded("m"))
        self.check(
            response(503, err_body("insufficient_capacity", instance_type="gpu")),
            t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("gpu"), "m")),
            "small",
        )
        self.check(
            response(503, err_body("insufficient_capacity")),
            t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("small"), "m")),
            "small",
        )
        self.check(
            response(503, err_body("insufficient_capacity")),
            t.Error_Capacity(t.Capacity(t.CapacityScope_General(), "m")),
        )
        self.check(response(503, body=b"down"), t.Error_Transient("sim answered 503: down"))
        self.check(response(404, err_body("not_found")), t.Error_NotFound("m"))
        self.check(response(401, err_body("unauthorized")), t.Error_Unauthorized("m"))
        self.check(response(403, err_body("forbidden")), t.Error_Unauthorized("m"))
        self.check(response(400, err_body("invalid_request")), t.Error_Permanent("m"))
        self.check(response(500, err_body("internal_error")), t.Error_Transient("m"))


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
            e = error_of(lambda: app.Driver().list([], None))
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
                state=t.InstanceState_Pending(),
                instance_type="small",
                tags=[("berth-node", "n-1"), ("berth-pool", "p1")],
                addresses=t.Addresses(None, "10.0.0.42", None, "i-2a.sim.internal"),
                created_at_ms=1790000000000,
                connection=t.Connection("berth", 22, []),
            ),
        )

    def test_states(self):
        for text, want in [
            ("pending", t.InstanceState_Pending()),
            ("running", t.InstanceState_Running()),
            ("stopping", t.InstanceState_Stopping()),
            ("terminated", t.InstanceState_Terminated()),
            ("failed", t.InstanceState_Failed("")),
            ("exploded", t.InstanceState_Unknown()),
        ]:
            self.assertEqual(sim_api.instance(sim_instance("i-1", {}, text)).state, want)

    def test_a_failed_instance_carries_the_sims_fault(self):
        failed = {**sim_instance("i-1", {}, "failed"), "fault": "the instance failed to boot"}
        self.assertEqual(sim_api.instance(failed).state, t.InstanceState_Failed("the instance failed to boot"))
        e = error_of(app.decode, response(200, {**failed, "fault": 7}), sim_api.instance)
        self.assertIsInstance(e, t.Error_Transient)

    def test_malformed_is_transient(self):
        for body in [
            b"{",
            {"id": 1, "state": "pending", "instance_type": "t"},
            {"id": "i", "state": "pending"},
            {**sim_instance("i", {}), "ssh_port": 70000},
            {**sim_instance("i", {}), "created_at_ms": True},
        ]:
            r = response(201, body=body) if isinstance(body, bytes) else response(201, body)
            e = error_of(app.decode, r, sim_api.instance)
            self.assertIsInstance(e, t.Error_Transient, body)
            self.assertIn("bad json", e.value)


class Calls(unittest.TestCase):
    def test_create_forces_pool_tag_and_sends_the_token(self):
        tags = [("berth-pool", "other"), ("berth-node", "n-1")]
        with FakeHttp() as cloud:
            cloud.respond("POST", "http://sim/v1/instances", 201, sim_instance("i-1", {"berth-pool": "p1"}))
            self.assertEqual(SIM.create(spec(tags=tags, ssh_public_key="ssh-ed25519 k")).id, "i-1")
        self.assertEqual(
            sent(cloud),
            [("POST", "http://sim/v1/instances", {
                "instance_type": "small",
                "image": "img",
                "tags": {"berth-node": "n-1", "berth-pool": "p1"},
                "client_token": TOKEN,
                "ssh_public_key": "ssh-ed25519 k",
            })],
        )
        self.assertEqual(cloud.requests[0].header("content-type"), "application/json")

    def test_create_capacity_names_the_type(self):
        with FakeHttp() as cloud:
            cloud.respond("POST", "http://sim/v1/instances", 503, err_body("insufficient_capacity"))
            e = error_of(SIM.create, spec("big"))
        self.assertEqual(e, t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("big"), "m")))

    def test_no_response_is_transient(self):
        with FakeHttp() as cloud:
            cloud.refuse("DELETE", "http://sim/v1/instances/i-1", "request failed: HttpRequestDenied")
            e = error_of(SIM.delete, "i-1")
        self.assertEqual(e, t.Error_Transient("request failed: HttpRequestDenied"))

    def test_list_answers_one_page_and_the_sims_cursor(self):
        mine = sim_instance("i-1", {"berth-pool": "p1", "berth-label": "a b"})
        stray = sim_instance("i-2", {"berth-pool": "p2", "berth-label": "a b"})
        url = "http://sim/v1/instances?tag:berth-pool=p1&tag:berth-label=a%20b&page_size=1"
        sim = app.Sim("p1", "http://sim", 1)
        filter = [("berth-pool", "p1"), ("berth-label", "a b")]
        with FakeHttp() as cloud:
            cloud.respond("GET", url, json={"instances": [mine], "next_page_token": "t/1"})
            first = sim.list(filter, None)
            # One request a call, whatever the sim has after it.
            self.assertEqual(len(cloud.requests), 1)
            cloud.respond("GET", f"{url}&page_token=t%2F1", json={"instances": [stray], "next_page_token": None})
            last = sim.list(filter, first.next)
        self.assertEqual(([i.id for i in first.instances], first.next), (["i-1"], "t/1"))
        # The stray instance of another pool is dropped.
        self.assertEqual(last, t.Page(instances=[], next=None))
        self.assertEqual(cloud.pending(), [])

    def test_list_of_foreign_pool_asks_nothing(self):
        with FakeHttp() as cloud:
            self.assertEqual(SIM.list([("berth-pool", "p2")], None), t.Page(instances=[], next=None))
        self.assertEqual(cloud.requests, [])

    def test_list_repeated_token_is_transient(self):
        url = "http://sim/v1/instances?tag:berth-pool=p1&page_token=x"
        with FakeHttp() as cloud:
            cloud.respond("GET", url, json={"instances": [], "next_page_token": "x"})
            e = error_of(SIM.list, [], "x")
        self.assertEqual(e, t.Error_Transient('sim repeated page token "x"'))

    def test_get_asks_for_those_ids_in_one_list(self):
        url = "http://sim/v1/instances?tag:berth-pool=p1&page_size=1000&id=i-1&id=i-2&id=i%2F3"
        found = [
            sim_instance("i-1", {"berth-pool": "p1"}, "failed"),
            # Another pool's, and one not asked for: neither is answered.
            sim_instance("i-2", {"berth-pool": "p2"}),
            sim_instance("i-9", {"berth-pool": "p1"}),
        ]
        with FakeHttp() as cloud:
            cloud.respond("GET", url, json={"instances": found, "next_page_token": None})
            got = SIM.get(["i-1", "i-2", "i/3"])
        self.assertEqual([(i.id, i.state) for i in got], [("i-1", t.InstanceState_Failed(""))])
        self.assertEqual(len(cloud.requests), 1)

    def test_get_of_nothing_asks_nothing(self):
        with FakeHttp() as cloud:
            self.assertEqual(SIM.get([]), [])
        self.assertEqual(cloud.requests, [])

    def test_get_maps_the_sims_errors(self):
        url = "http://sim/v1/instances?tag:berth-pool=p1&page_size=1000&id=nope"
        with FakeHttp() as cloud:
            cloud.respond("GET", url, 400, err_body("invalid_request"))
            self.assertEqual(error_of(SIM.get, ["nope"]), t.Error_Permanent("m"))

    def test_batches_are_not_supported(self):
        self.assertFalse(app.describe().capabilities & (t.Capabilities.CREATE_MANY | t.Capabilities.DELETE_MANY))
        made = app.Driver().create_many([spec(), spec()])
        self.assertEqual(made, [Err(t.Error_Permanent("create-many is not supported by this driver"))] * 2)
        gone = app.Driver().delete_many(["i-1"])
        self.assertEqual(gone, [Err(t.Error_Permanent("delete-many is not supported by this driver"))])

    def test_delete_not_found(self):
        with FakeHttp() as cloud:
            cloud.respond("DELETE", "http://sim/v1/instances/i-1", 404, err_body("not_found"))
            self.assertEqual(error_of(SIM.delete, "i-1"), t.Error_NotFound("m"))

    def test_set_tags_keeps_pool_and_drops_foreign_keys(self):
        with FakeHttp() as cloud:
            cloud.respond("PUT", "http://sim/v1/instances/i%2F1/tags", 204)
            SIM.set_tags("i/1", [("berth-node", "n-2"), ("name", "x")])
            # Moving to another pool is refused before any request.
            e = error_of(SIM.set_tags, "i-1", [("berth-pool", "p2")])
        self.assertIsInstance(e, t.Error_Permanent)
        self.assertEqual(
            sent(cloud),
            [
                (
                    "PUT",
                    "http://sim/v1/instances/i%2F1/tags",
                    {"tags": {"berth-node": "n-2", "berth-pool": "p1"}},
                )
            ],
        )

    def test_limits(self):
        with FakeHttp() as cloud:
            cloud.respond("GET", "http://sim/v1/limits", json={"max_instances": None, "used_instances": 3})
            self.assertEqual(SIM.limits(), t.AccountLimits(None, None, None, 3, None, None))


if __name__ == "__main__":
    unittest.main()
