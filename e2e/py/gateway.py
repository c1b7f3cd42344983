"""A third-party gateway of a Meridian service over the documented NATS API (nats-py, not the project's code).

Usage: gateway.py SERVICE TENANT LOCATIONS_JSON, with the access in the environment as for api_client.py
(MERIDIAN_NATS, MERIDIAN_CA, MERIDIAN_CREDS, MERIDIAN_TOKEN: the gateway's token). Reports the locations' rates
on `meridian.v1.api.<name>.services.demand`, sends a report with a latitude out of range (it must be refused with the
field's path), reads the routing table on `meridian.v1.api.<name>.services.routes`, and prints what it saw as one JSON
line.
"""

import asyncio
import json
import sys

from api_client import call, connect


async def main():
    service, tenant, locations = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    nc = await connect()
    out = {}
    report = {"v": 1, "tenant": tenant, "service": service, "locations": locations}
    out["report"] = await call(nc, "services.demand", report)
    bad = json.loads(json.dumps(report))
    bad["locations"][0]["location"]["lat"] = 123.0
    out["bad_report_error"] = (await call(nc, "services.demand", bad)).get("error")
    ref = {"v": 1, "tenant": tenant, "name": service}
    out["routes"] = await call(nc, "services.routes", ref)
    print(json.dumps(out))
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
