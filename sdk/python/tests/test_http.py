"""berth_driver.http outside a component (URLs, responses) and
berth_driver.testing, the fake host that `send` goes to in tests."""

import unittest

import stub_bindings  # noqa: F401  (the SDK and the bindings on the path)
from wit_world.imports import berth_driver_types as t
from wit_world.imports import log

from berth_driver import errors, http
from berth_driver.http import HttpError, Response, encode_component, parse_url, send
from berth_driver.testing import FakeHttp, capture_log, error_of, response


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
            ("http://[::1]x/", "junk"),
            ("http://::1/", "brackets"),
            ("http://h/a b", "whitespace"),
        ]:
            with self.assertRaisesRegex(ValueError, why, msg=text):
                parse_url(text)

    def test_encode_component(self):
        self.assertEqual(encode_component("berth-pool"), "berth-pool")
        self.assertEqual(encode_component("a b/c?d=e&f"), "a%20b%2Fc%3Fd%3De%26f")
        self.assertEqual(encode_component("é"), "%C3%A9")
        self.assertEqual(encode_component("A-z_0.9~"), "A-z_0.9~")


class Responses(unittest.TestCase):
    def test_accessors(self):
        r = Response(201, [("content-type", "application/json"), ("x", "1"), ("x", "2")], b'{"a": 1}')
        self.assertEqual(r.header("Content-Type"), "application/json")
        self.assertEqual(r.header("x"), "1")
        self.assertIsNone(r.header("missing"))
        self.assertEqual(r.json(), {"a": 1})
        self.assertTrue(r.is_success())
        self.assertFalse(Response(404, [], b"").is_success())
        self.assertEqual(Response(200, [], b"\xff!").text(), "\ufffd!")
        with self.assertRaises(ValueError):
            Response(200, [], b"{").json()

    def test_response_helper(self):
        r = response(404, json=None, headers=[("Retry-After", "1")])
        self.assertEqual(r, Response(404, [("retry-after", "1"), ("content-type", "application/json")], b"null"))
        self.assertEqual(response(), Response(200, [], b""))
        r = response(200, json={"a": 1}, headers=[("Content-Type", "application/x")])
        self.assertEqual(r.headers, [("content-type", "application/x")])


class Fake(unittest.TestCase):
    def test_answers_per_route_in_order_and_records(self):
        with FakeHttp() as cloud:
            cloud.respond("GET", "http://c/v1/x?page=1", json={"n": 1})
            cloud.respond("GET", "http://c/v1/x?page=1", json={"n": 2})
            cloud.respond("PUT", "http://c/v1/x", status=204)
            self.assertEqual(send("PUT", "http://c/v1/x", b'{"k":"v"}', [("content-type", "application/json")]).status, 204)
            self.assertEqual(send("GET", "http://c/v1/x?page=1").json(), {"n": 1})
            self.assertEqual(send("GET", "http://c/v1/x?page=1").json(), {"n": 2})
        self.assertEqual(cloud.pending(), [])
        self.assertEqual(
            [(r.method, r.url, r.json()) for r in cloud.requests],
            [("PUT", "http://c/v1/x", {"k": "v"}), ("GET", "http://c/v1/x?page=1", None), ("GET", "http://c/v1/x?page=1", None)],
        )
        self.assertEqual(cloud.requests[0].header("Content-Type"), "application/json")
        self.assertEqual(cloud.requests[0].text(), '{"k":"v"}')
        self.assertEqual(cloud.requests[1].text(), "")

    def test_refuse_is_no_response(self):
        with FakeHttp() as cloud:
            cloud.refuse("DELETE", "http://c/i/1")
            cloud.refuse("GET", "http://c/", "request failed: ConnectionRefused")
            with self.assertRaisesRegex(HttpError, "^request failed: HttpRequestDenied$"):
                send("DELETE", "http://c/i/1")
            with self.assertRaisesRegex(HttpError, "ConnectionRefused"):
                send("GET", "http://c/")

    def test_unexpected_request_fails_the_test(self):
        with FakeHttp() as cloud:
            cloud.respond("GET", "http://c/a")
            with self.assertRaisesRegex(AssertionError, r"POST http://c/a.*\('GET', 'http://c/a'\)"):
                send("POST", "http://c/a")
            send("GET", "http://c/a")
            with self.assertRaisesRegex(AssertionError, "GET http://c/a; queued: nothing"):
                send("GET", "http://c/a")
        self.assertEqual([r.method for r in cloud.requests], ["POST", "GET", "GET"])

    def test_bad_url_never_reaches_the_cloud(self):
        with FakeHttp() as cloud:
            with self.assertRaisesRegex(HttpError, "invalid url"):
                send("GET", "ftp://c/")
        self.assertEqual(cloud.requests, [])

    def test_install_nests_and_restores(self):
        outer, inner = FakeHttp(), FakeHttp()
        outer.respond("GET", "http://c/")
        inner.respond("GET", "http://c/", status=500)
        with outer:
            with inner:
                self.assertEqual(send("GET", "http://c/").status, 500)
            self.assertEqual(send("GET", "http://c/").status, 200)
        self.assertIsNone(http.set_transport(None))

    def test_error_of(self):
        self.assertEqual(error_of(errors.fail, errors.transient("x")), t.Error_Transient("x"))
        with self.assertRaisesRegex(AssertionError, "returned no error"):
            error_of(lambda: None)

    def test_capture_log(self):
        original = log.log
        with capture_log() as records:
            log.log(log.Level.INFO, "created", [("instance", "i-1")])
        self.assertIs(log.log, original)
        self.assertEqual(records, [(log.Level.INFO, "created", [("instance", "i-1")])])


if __name__ == "__main__":
    unittest.main()
