"""An attacker's client (nats-py, not the project's code) that tries to borrow the broker's hand.

Usage: reply_attack.py PLAN_JSON, with the access in the environment as for api_client.py (MERIDIAN_NATS,
MERIDIAN_CA, MERIDIAN_CREDS: the attacker's own credential, a site's or an API client's; no MERIDIAN_TOKEN).
PLAN_JSON is a file: {"requests": [{"subject": S, "body": TEXT}], "replies": [R], "control": {"subject": S,
"body": TEXT}}. Every request is sent once with each reply subject R (a subject only a broker may write, or
another identity's inbox), so that a broker answering "whatever reply subject a request names" would write
there with its own permissions. Then the control request is sent with the attacker's own inbox as its reply
(a broker answers that one). With "flood": {"subject": S, "body": TEXT, "count": N}, N such requests are then
sent as fast as it can, 200 at a time, and the error codes of the answers counted. Prints {"sent": N,
"control": REPLY, "flood": {CODE: COUNT}} as one JSON line.
"""

import asyncio
import json
import sys

from api_client import connect


async def main():
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    nc = await connect()
    sent = 0
    for r in plan["requests"]:
        for reply in plan["replies"]:
            await nc.publish(r["subject"], r["body"].encode(), reply=reply)
            sent += 1
    await nc.flush()
    c = plan["control"]
    answer = await nc.request(c["subject"], c["body"].encode(), timeout=10)
    out = {"sent": sent, "control": json.loads(answer.data)}
    flood = plan.get("flood")
    if flood:
        codes = {}

        async def one():
            r = await nc.request(flood["subject"], flood["body"].encode(), timeout=10)
            code = (json.loads(r.data).get("error") or {}).get("code", "ok")
            codes[code] = codes.get(code, 0) + 1

        left = flood["count"]
        while left > 0:
            n = min(200, left)
            await asyncio.gather(*(one() for _ in range(n)))
            left -= n
        out["flood"] = codes
    print(json.dumps(out))
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(main())
