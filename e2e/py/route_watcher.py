"""A third-party watcher of a Meridian service's routing table over the documented NATS API (nats-py).

Usage: route_watcher.py SERVICE TENANT SECONDS, with the access in the environment as for api_client.py
(MERIDIAN_TOKEN: the gateway's token; MERIDIAN_OTHER_TOKEN: another tenant's, whose watch must be refused).
First sends a watch with a lease out of range (refused with the field named) and one with the other tenant's
token (refused), printing each answer as a JSON line; then watches `meridian.v1.api.<name>.services.routes.watch` from
its own inbox, renewing the lease every 20 s, and prints every message that arrives there as a JSON line
`{"watch": ...}` until SECONDS have passed.
"""

import asyncio
import json
import os
import sys

from api_client import call, connect, headers, subject

WATCH = "services.routes.watch"


async def main():
    service, tenant, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    nc = await connect()
    request = {"v": 1, "tenant": tenant, "name": service, "lease_s": 30}
    bad = dict(request, lease_s=0)
    print(json.dumps({"bad_lease": await call(nc, WATCH, bad)}), flush=True)
    other = os.environ.get("MERIDIAN_OTHER_TOKEN")
    if other:
        print(json.dumps({"other_tenant": await call(nc, WATCH, request, token=other)}), flush=True)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    token = os.environ.get("MERIDIAN_TOKEN")
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    renew_at = 0.0
    while loop.time() < end:
        if loop.time() >= renew_at:
            await nc.publish(subject(WATCH), json.dumps(request).encode(), reply=inbox, headers=headers(token))
            renew_at = loop.time() + 20
        try:
            msg = await sub.next_msg(timeout=0.5)
        except asyncio.TimeoutError:
            continue
        except Exception as e:  # nats-py raises its own timeout type
            if "Timeout" in type(e).__name__:
                continue
            raise
        print(json.dumps({"watch": json.loads(msg.data)}), flush=True)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
