"""Unit tests of the driver on this machine's Python, run by `build`.

The contract's types come from the stubs `componentize-py bindings` writes
(real types; host functions that raise `NotImplementedError`), and HTTP from
`berth_driver.testing.FakeHttp`, which answers the requests a test queued and
records every one. `berth driver test` tests the built component against a
real endpoint.
"""

import unittest

from berth_driver.testing import FakeHttp, error_of, response
from wit_world.imports import berth_driver_types as t

import app

CLOUD = app.Cloud(pool_id="p1", endpoint="http://cloud", page_size=None)


def instance(id: str, tags: dict) -> dict:
    """An instance as the cloud's JSON."""
    return {"id": id, "state": "pending", "instance_type": "small", "tags": tags}


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
    def test_create_forces_the_pool_tag_and_sends_the_node_id(self):
        spec = t.CreateSpec(
            node_id="n-1",
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
                "client_token": "n-1",
            },
        )

    def test_list_follows_every_page_and_filters(self):
        url = "http://cloud/v1/instances?tag:berth-pool=p1&tag:berth-label=a%20b&page_size=1"
        mine = instance("i-1", {"berth-pool": "p1", "berth-label": "a b"})
        also_mine = instance("i-3", {"berth-pool": "p1", "berth-label": "a b"})
        # The cloud filters already; an instance that slips through is dropped.
        other = instance("i-2", {"berth-pool": "p2", "berth-label": "a b"})
        with FakeHttp() as cloud:
            cloud.respond("GET", url, json={"instances": [mine], "next_page_token": "t/1"})
            cloud.respond("GET", url + "&page_token=t%2F1", json={"instances": [other, also_mine], "next_page_token": None})
            got = app.Cloud("p1", "http://cloud", 1).list([("berth-pool", "p1"), ("berth-label", "a b")])
        self.assertEqual([i.id for i in got], ["i-1", "i-3"])
        self.assertEqual(cloud.pending(), [])

    def test_list_of_another_pool_asks_nothing(self):
        with FakeHttp() as cloud:
            self.assertEqual(CLOUD.list([("berth-pool", "p2")]), [])
        self.assertEqual(cloud.requests, [])

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
