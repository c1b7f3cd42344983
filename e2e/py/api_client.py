"""A third-party client of Meridian's documented NATS API (nats-py, not the project's code).

Usage: api_client.py, with the access `meridian up` prints in the environment: MERIDIAN_NATS (servers),
MERIDIAN_CA (the CA that signs them), MERIDIAN_CREDS (the client's NKey seed file `<name>.nk`, with its client
certificate `<name>.crt` and key `<name>.key` beside it; replies arrive under the inbox prefix `_INBOX.<name>`)
and MERIDIAN_TOKEN (sent as `Authorization: Bearer <token>` on every request). A request goes to the caller's
own subject, `meridian.v1.api.<name>.<call>`, and its reply subject must be in the caller's own inbox. Submits a job with a misspelt field (it must be refused with the field's path),
then good jobs, lists every job page by page through `meridian.v1.api.<name>.jobs.list`, and prints what it saw as one
JSON line.
"""

import asyncio
import json
import os
import ssl

import nats


async def connect():
    """Connects the way the README documents: TLS against the CA, the client certificate, the NKey."""
    servers = os.environ["MERIDIAN_NATS"].split(",")
    options = {}
    ca, creds = os.environ.get("MERIDIAN_CA"), os.environ.get("MERIDIAN_CREDS")
    if ca:
        tls = ssl.create_default_context(cafile=ca)
        if creds:
            stem = os.path.splitext(creds)[0]
            tls.load_cert_chain(stem + ".crt", stem + ".key")
        options["tls"] = tls
    if creds:
        options["nkeys_seed"] = creds
    options["inbox_prefix"] = f"_INBOX.{identity()}".encode()
    return await nats.connect(servers, **options)


def identity():
    """The NATS identity: the credential file's stem (`anonymous` without one)."""
    creds = os.environ.get("MERIDIAN_CREDS")
    return os.path.splitext(os.path.basename(creds))[0] if creds else "anonymous"


def subject(call_name):
    """The subject on which this identity makes a call (e.g. `jobs.submit`)."""
    return f"meridian.v1.api.{identity()}.{call_name}"


def headers(token):
    return {"Authorization": f"Bearer {token}"} if token else None


async def call(nc, call_name, body, token=None):
    token = token if token is not None else os.environ.get("MERIDIAN_TOKEN")
    reply = await nc.request(
        subject(call_name), json.dumps(body).encode(), timeout=10, headers=headers(token)
    )
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


async def main():
    nc = await connect()
    out = {}
    typo = await call(
        nc, "jobs.submit", spec("typo", constraints={"residancy": "eu"})
    )
    out["typo_error"] = typo.get("error")
    ids = []
    for i in range(30):
        r = await call(nc, "jobs.submit", spec(f"py-{i}"))
        ids.append(r["ok"]["job"])
    out["submitted"] = len(ids)
    listed, pages, cursor = [], 0, None
    while True:
        req = {"v": 1, "limit": 7}
        if cursor:
            req["cursor"] = cursor
        page = (await call(nc, "jobs.list", req))["ok"]
        pages += 1
        listed += [j["job"] for j in page["jobs"]]
        cursor = page.get("next")
        if not cursor:
            break
    out["listed"] = len(set(listed))
    out["pages"] = pages
    out["all_submitted_listed"] = set(ids) <= set(listed)
    bad_list = await call(nc, "jobs.list", {"v": 1, "limt": 5})
    out["bad_list_error"] = bad_list.get("error")
    no_token = await call(nc, "jobs.list", {"v": 1}, token="")
    out["no_token_error"] = no_token.get("error")
    out["version"] = (await call(nc, "version", {"v": 1})).get("ok")
    print(json.dumps(out))
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
