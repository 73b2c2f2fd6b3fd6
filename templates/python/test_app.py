"""Unit tests of the driver on this machine's Python, run by `build`.

The contract's types come from the stubs `componentize-py bindings` writes
(real types; host functions that raise `NotImplementedError`), and HTTP from
`berth_driver.testing.FakeHttp`, which answers the requests a test queued and
records every one. `berth driver test` tests the built component against a
real endpoint.
"""

import unittest

from berth_driver.testing import FakeHttp, error_of, response
from componentize_py_types import Err
from wit_world.imports import berth_driver_types as t

import app

CLOUD = app.Cloud(pool_id="p1", endpoint="http://cloud", page_size=None)


def instance(id: str, tags: dict, state: str = "pending", **more) -> dict:
    """An instance as the cloud's JSON."""
    return {"id": id, "state": state, "instance_type": "small", "tags": tags, **more}


class Configure(unittest.TestCase):
    def test_accepts_a_config(self):
        got = app.configure("p1", '{"endpoint": "http://127.0.0.1:8181/", "page_size": 5}')
        self.assertEqual(got, app.Cloud("p1", "http://127.0.0.1:8181", 5))

    def test_names_every_wrong_field(self):
        for config, needles in [
            ("not json", ["provider config"]),
            ("{}", ["endpoint"]),
            ('{"endpoint": "ftp://h"}', ["endpoint"]),
            ('{"endpoint": "http://h", "page_size": 0}', ["page_size"]),
            ('{"colour": 1, "page_size": true}', ["colour", "endpoint", "page_size"]),
        ]:
            e = error_of(app.configure, "p1", config)
            self.assertIsInstance(e, t.Error_InvalidConfig, config)
            for needle in needles:
                self.assertIn(needle, e.value, config)


class Calls(unittest.TestCase):
    def test_create_forces_the_pool_tag_and_sends_the_token(self):
        spec = t.CreateSpec(
            node_id="n-1",
            token="6f1c2a4e-9b7d-4c3e-8a5f-0d2b1e3c4a5b",
            instance_type="small",
            image="img",
            tags=[("berth-pool", "other"), ("berth-node", "n-1")],
            user_data=None,
            ssh_public_key=None,
            options="{}",
        )
        with FakeHttp() as cloud:
            cloud.respond("POST", "http://cloud/v1/instances", 201, instance("i-1", {"berth-pool": "p1"}))
            self.assertEqual(CLOUD.create(spec).id, "i-1")
        self.assertEqual(
            cloud.requests[0].json(),
            {
                "instance_type": "small",
                "image": "img",
                "tags": {"berth-pool": "p1", "berth-node": "n-1"},
                "client_token": "6f1c2a4e-9b7d-4c3e-8a5f-0d2b1e3c4a5b",
            },
        )

    def test_list_returns_one_page_and_its_cursor(self):
        url = "http://cloud/v1/instances?tag:berth-pool=p1&tag:berth-label=a%20b&page_size=1"
        mine = instance("i-1", {"berth-pool": "p1", "berth-label": "a b"})
        also_mine = instance("i-3", {"berth-pool": "p1", "berth-label": "a b"})
        # The cloud filters already; an instance that slips through is dropped.
        other = instance("i-2", {"berth-pool": "p2", "berth-label": "a b"})
        cloud_ = app.Cloud("p1", "http://cloud", 1)
        filter = [("berth-pool", "p1"), ("berth-label", "a b")]
        with FakeHttp() as cloud:
            cloud.respond("GET", url, json={"instances": [mine], "next_page_token": "t/1"})
            first = cloud_.list(filter, None)
            # One request per call: the host asks for the next page.
            self.assertEqual(len(cloud.requests), 1)
            cloud.respond("GET", url + "&page_token=t%2F1", json={"instances": [other, also_mine], "next_page_token": None})
            last = cloud_.list(filter, first.next)
        self.assertEqual(([i.id for i in first.instances], first.next), (["i-1"], "t/1"))
        self.assertEqual(([i.id for i in last.instances], last.next), (["i-3"], None))
        self.assertEqual(cloud.pending(), [])

    def test_list_refuses_a_page_token_that_does_not_move(self):
        url = "http://cloud/v1/instances?tag:berth-pool=p1&page_token=x"
        with FakeHttp() as cloud:
            cloud.respond("GET", url, json={"instances": [], "next_page_token": "x"})
            self.assertIsInstance(error_of(CLOUD.list, [], "x"), t.Error_Transient)

    def test_list_of_another_pool_asks_nothing(self):
        with FakeHttp() as cloud:
            self.assertEqual(CLOUD.list([("berth-pool", "p2")], None), t.Page(instances=[], next=None))
        self.assertEqual(cloud.requests, [])

    def test_get_asks_for_the_ids_alone_and_keeps_the_pools(self):
        url = "http://cloud/v1/instances?tag:berth-pool=p1&page_size=1000&id=i-1&id=i%2F2&id=i-3"
        found = [
            instance("i-1", {"berth-pool": "p1"}),
            # Another pool's, and one not asked for: both dropped.
            instance("i/2", {"berth-pool": "p2"}),
            instance("i-4", {"berth-pool": "p1"}),
        ]
        with FakeHttp() as cloud:
            cloud.respond("GET", url, json={"instances": found, "next_page_token": None})
            got = CLOUD.get(["i-1", "i/2", "i-3"])
        self.assertEqual([i.id for i in got], ["i-1"])
        with FakeHttp() as cloud:
            self.assertEqual(CLOUD.get([]), [])
        self.assertEqual(cloud.requests, [])

    def test_states_and_the_failed_reason(self):
        for state, more, want in [
            ("pending", {}, t.InstanceState_Pending()),
            ("running", {}, t.InstanceState_Running()),
            ("stopping", {}, t.InstanceState_Stopping()),
            ("terminated", {}, t.InstanceState_Terminated()),
            ("failed", {"fault": "no host"}, t.InstanceState_Failed("no host")),
            ("failed", {}, t.InstanceState_Failed("")),
            ("exploded", {}, t.InstanceState_Unknown()),
        ]:
            got = app.to_instance(instance("i-1", {}, state, **more))
            self.assertEqual(got.state, want, state)

    def test_batches_are_not_supported(self):
        self.assertFalse(app.describe().capabilities & t.Capabilities.CREATE_MANY)
        permanent = lambda what: Err(t.Error_Permanent(f"{what} is not supported by this driver"))
        self.assertEqual(app.Driver().create_many(["a", "b"]), [permanent("create-many")] * 2)
        self.assertEqual(app.Driver().delete_many(["i-1"]), [permanent("delete-many")])

    def test_delete_of_a_gone_instance_is_not_found(self):
        with FakeHttp() as cloud:
            cloud.respond("DELETE", "http://cloud/v1/instances/i%2F1", 404, body=b"gone")
            self.assertEqual(error_of(CLOUD.delete, "i/1"), t.Error_NotFound("HTTP 404: gone"))

    def test_set_tags_sends_berth_tags_and_keeps_the_pool(self):
        with FakeHttp() as cloud:
            cloud.respond("PUT", "http://cloud/v1/instances/i-1/tags", 204)
            CLOUD.set_tags("i-1", [("berth-node", "n-2"), ("name", "x")])
        self.assertEqual(cloud.requests[0].json(), {"tags": {"berth-node": "n-2", "berth-pool": "p1"}})

    def test_limits(self):
        with FakeHttp() as cloud:
            cloud.respond("GET", "http://cloud/v1/limits", json={"max_instances": 10, "used_instances": 3})
            self.assertEqual(CLOUD.limits(), t.AccountLimits(10, None, None, 3, None, None))


class Errors(unittest.TestCase):
    def test_maps_failed_responses(self):
        def body(code: str) -> dict:
            return {"error": {"code": code, "message": "m"}}

        for resp, want in [
            (response(403, body("quota_exceeded")), t.Error_QuotaExceeded("m")),
            (response(403, body("forbidden")), t.Error_Unauthorized("m")),
            (
                response(503, body("insufficient_capacity")),
                t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("small"), "m")),
            ),
            (
                response(429, body("rate_limited"), headers=[("retry-after", "3")]),
                t.Error_RateLimited(t.RateLimit(3000, "m")),
            ),
            (response(500, body=b"oops"), t.Error_Transient("HTTP 500: oops")),
            (response(400, body("invalid_request")), t.Error_Permanent("m")),
        ]:
            self.assertEqual(app.api_error(resp, "small"), want, resp)

    def test_no_response_is_transient(self):
        with FakeHttp() as cloud:
            cloud.refuse("GET", "http://cloud/v1/limits", "request failed: HttpRequestDenied")
            e = error_of(CLOUD.limits)
        self.assertEqual(e, t.Error_Transient("request failed: HttpRequestDenied"))

    def test_a_body_that_is_not_the_clouds_json_is_transient(self):
        with FakeHttp() as cloud:
            cloud.respond("GET", "http://cloud/v1/limits", json={"max_instances": "many"})
            self.assertIsInstance(error_of(CLOUD.limits), t.Error_Transient)


if __name__ == "__main__":
    unittest.main()
