"""A third-party client of Meridian's documented NATS API (nats-py, not the project's code).

Usage: api_client.py NATS_URL. Submits a job with a misspelt field (it must be refused with the field's path),
then good jobs, lists every job page by page through `meridian.v1.api.jobs.list`, and prints what it saw as one
JSON line.
"""

import asyncio
import json
import sys

import nats


async def call(nc, subject, body):
    reply = await nc.request(subject, json.dumps(body).encode(), timeout=10)
    return json.loads(reply.data)


def spec(key, **extra):
    s = {
        "v": 1,
        "tenant": "py",
        "idempotency_key": key,
        "kind": "batch",
        "resources": {"kind": "gpu", "count": 1},
        "run": {"command": "sleep 600"},
    }
    s.update(extra)
    return s


async def main(url):
    nc = await nats.connect(url)
    out = {}
    typo = await call(
        nc, "meridian.v1.api.jobs.submit", spec("typo", constraints={"residancy": "eu"})
    )
    out["typo_error"] = typo.get("error")
    ids = []
    for i in range(30):
        r = await call(nc, "meridian.v1.api.jobs.submit", spec(f"py-{i}"))
        ids.append(r["ok"]["job"])
    out["submitted"] = len(ids)
    listed, pages, cursor = [], 0, None
    while True:
        req = {"v": 1, "limit": 7}
        if cursor:
            req["cursor"] = cursor
        page = (await call(nc, "meridian.v1.api.jobs.list", req))["ok"]
        pages += 1
        listed += [j["job"] for j in page["jobs"]]
        cursor = page.get("next")
        if not cursor:
            break
    out["listed"] = len(set(listed))
    out["pages"] = pages
    out["all_submitted_listed"] = set(ids) <= set(listed)
    bad_list = await call(nc, "meridian.v1.api.jobs.list", {"v": 1, "limt": 5})
    out["bad_list_error"] = bad_list.get("error")
    print(json.dumps(out))
    await nc.close()


asyncio.run(main(sys.argv[1]))
