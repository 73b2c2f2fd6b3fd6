#!/usr/bin/env python3
"""A scheduler's loop against berth, with Python's standard library only:
ask for the nodes a job needs with an idempotency key the job owns, wait on
the event stream until they are handed out, run the job, give them back.
Every step may be sent again after a timeout or a restart of the scheduler.

    BERTH_SERVER=http://127.0.0.1:8080 BERTH_TOKEN=… python3 examples/scheduler.py JOB small=2

It prints what it did as one JSON object on standard output.
"""

import json
import os
import sys
import urllib.error
import urllib.request

API = os.environ.get("BERTH_SERVER", "http://127.0.0.1:8080").rstrip("/")
TOKEN = os.environ["BERTH_TOKEN"]


def call(method, path, body=None, headers=(), accept=()):
    """One call; its status and JSON answer. An error status not in
    `accept` ends the script with berth's error body."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(API + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + TOKEN)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for name, value in headers:
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        if e.code in accept:
            return e.code, json.loads(text)
        sys.exit(f"{method} {path}: {e.code} {text}")


def nodes_for(job, labels):
    """The request for `labels`, once it is no longer pending, and whether
    this call made it (201) or found the one an earlier try made (200)."""
    # 1. Ask. The key is the job's own: a retry finds the request the
    #    first try made, through a restart of berth or a failover too.
    status, req = call(
        "POST",
        "/v1/requests",
        {"labels": labels, "metadata": {"job": job}},
        headers=[("Idempotency-Key", f"job-{job}")],
    )
    # 2. Wait: open the stream first, then read the request once; every
    #    change after that comes on the stream.
    stream = urllib.request.Request(
        API + "/v1/events?kinds=request", headers={"Authorization": "Bearer " + TOKEN}
    )
    with urllib.request.urlopen(stream, timeout=60) as events:
        _, req = call("GET", f"/v1/requests/{req['id']}")
        while req["state"] == "pending":
            raw = events.readline()  # a comment comes every 15 s
            if not raw:
                sys.exit("the event stream ended; ask again (the key finds the request)")
            line = raw.decode().strip()
            ours = line.startswith("data: ") and json.loads(line[6:]).get("id") == req["id"]
            # `reset`: events were missed; read the request again.
            if ours or line == "event: reset":
                _, req = call("GET", f"/v1/requests/{req['id']}")
    return req, status


def main():
    job = sys.argv[1]
    labels = {}
    for arg in sys.argv[2:] or ["small"]:
        name, _, count = arg.partition("=")
        labels[name] = int(count or 1)
    req, status = nodes_for(job, labels)
    if req["state"] != "fulfilled":
        sys.exit(f"{req['id']} {req['state']}: {req.get('reason')}")
    nodes = [n["id"] for n in req["nodes"]]
    # ... the job runs on the nodes (each has `addresses` and `connection`) ...
    # 3. Give them back. Sent again, a release answers 409 (released
    #    already) or 404 (forgotten since): both mean done.
    released = {}
    for node in nodes:
        code, _ = call("POST", f"/v1/nodes/{node}/release", accept=(404, 409))
        released[node] = code
    print(json.dumps({"request": req["id"], "asked": status, "released": released}))


if __name__ == "__main__":
    main()
