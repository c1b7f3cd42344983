"""The EC2 API of the tests: moto in server mode (PyPI moto[server]) behind a small fault-injecting proxy.

moto answers the EC2 Query API for real (DescribeInstanceTypes with GpuInfo, RunInstances, tags, filters,
TerminateInstances) but never runs out of capacity, never refuses for a quota and never reclaims a spot
instance. The proxy in front of it answers the RunInstances calls that `faults.json` (in the folder given,
read at every call) names with EC2's own XML error bodies, and logs every call it passes (`requests.log`,
one JSON object a line: action, region, zone, market, code). A test plays a spot reclaim by terminating the
instance itself (`ctl`, through boto3: a client that is not Meridian's).

    python ec2_emulator.py serve DIR      # writes DIR/endpoint (the proxy's URL) and DIR/moto (moto's)
    python ec2_emulator.py ctl URL describe
    python ec2_emulator.py ctl URL terminate INSTANCE_ID [REGION]
    python ec2_emulator.py ctl URL run SITE INSTANCE_TYPE REGION   # an instance tagged as SITE's

faults.json: [{"action": "RunInstances", "region": "us-east-1", "zone": "us-east-1a", "market": "spot",
               "code": "InsufficientInstanceCapacity", "times": -1}]   (zone/market/region optional; times -1: always)
"""

import json
import os
import re
import sys
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATUS = {"RequestLimitExceeded": 503, "SignatureDoesNotMatch": 403}
# The secret key the tests give the agents (AWS_SECRET_ACCESS_KEY): every call must be signed with it.
SECRET = os.environ.get("EC2_EMULATOR_SECRET", "meridian-test-secret")


def error_xml(code):
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>%s</Code>'
        "<Message>%s (injected by the test's fault proxy)</Message></Error></Errors>"
        "<RequestID>fault-proxy</RequestID></Response>" % (code, code)
    ).encode()


def signature_matches(method, url, headers, body, secret):
    """Recomputes a request's SigV4 signature with botocore (AWS's Python signer) and compares it."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth_header = headers.get("authorization", "")
    m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d+)/([^/]+)/([^/]+)/aws4_request, "
                 r"SignedHeaders=([^,]+), Signature=([0-9a-f]+)$", auth_header)
    if not m:
        return False
    key, _, region, service, signed, signature = m.groups()
    signed_headers = {h: headers.get(h, "") for h in signed.split(";")}
    req = AWSRequest(method=method, url=url, data=body, headers=signed_headers)
    req.context["timestamp"] = headers.get("x-amz-date", "")
    auth = SigV4Auth(Credentials(key, secret), service, region)
    expected = auth.signature(auth.string_to_sign(req, auth.canonical_request(req)), req)
    return expected == signature


def serve(folder):
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    upstream = "http://%s:%d" % (host, port)
    lock = threading.Lock()
    faults_path = os.path.join(folder, "faults.json")
    log_path = os.path.join(folder, "requests.log")

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
            one = lambda k: (form.get(k) or [""])[0]
            m = re.search(r"Credential=[^/]+/\d+/([^/]+)/", self.headers.get("authorization", ""))
            call = {
                "action": one("Action"),
                "region": m.group(1) if m else "",
                "zone": one("Placement.AvailabilityZone"),
                "market": one("InstanceMarketOptions.MarketType") or ("on-demand" if one("Action") == "RunInstances" else ""),
                "signed": bool(m),
            }
            code = None
            with lock:
                try:
                    with open(faults_path) as f:
                        faults = json.load(f)
                except (OSError, ValueError):
                    faults = []
                for rule in faults:
                    if rule.get("times", -1) == 0:
                        continue
                    if all(rule.get(k) in (None, call[k]) for k in ("action", "region", "zone", "market")):
                        code = rule["code"]
                        if rule.get("times", -1) > 0:
                            rule["times"] -= 1
                            with open(faults_path, "w") as f:
                                json.dump(faults, f)
                        break
            if code is None:
                url = "http://%s%s" % (self.headers.get("host", ""), self.path)
                if not call["signed"] or not signature_matches("POST", url, self.headers, body, SECRET):
                    code = "SignatureDoesNotMatch"
                    call["signed"] = False
            if code is not None:
                reply, status = error_xml(code), STATUS.get(code, 400)
            else:
                req = urllib.request.Request(upstream + self.path, data=body, method="POST")
                for k in ("content-type", "authorization", "x-amz-date", "x-amz-security-token"):
                    if self.headers.get(k):
                        req.add_header(k, self.headers[k])
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        reply, status = r.read(), r.status
                except urllib.error.HTTPError as e:
                    reply, status = e.read(), e.code
            call["code"] = code or ("ok" if status < 400 else "HTTP%d" % status)
            with lock, open(log_path, "a") as f:
                f.write(json.dumps(call) + "\n")
            self.send_response(status)
            self.send_header("content-type", "text/xml")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    for name, url in (("moto", upstream), ("endpoint", "http://127.0.0.1:%d/" % server.server_address[1])):
        with open(os.path.join(folder, name + ".tmp"), "w") as f:
            f.write(url)
        os.rename(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
    server.serve_forever()


def ctl(url, command, *args):
    import boto3

    def client(region):
        return boto3.client(
            "ec2", endpoint_url=url, region_name=region,
            aws_access_key_id="test", aws_secret_access_key="test",
        )

    if command == "describe":
        out = []
        for region in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1"):
            for r in client(region).describe_instances()["Reservations"]:
                for i in r["Instances"]:
                    out.append({
                        "id": i["InstanceId"],
                        "region": region,
                        "state": i["State"]["Name"],
                        "type": i["InstanceType"],
                        "zone": i["Placement"]["AvailabilityZone"],
                        "spot": i.get("InstanceLifecycle") == "spot",
                        "tags": {t["Key"]: t["Value"] for t in i.get("Tags", [])},
                    })
        print(json.dumps(out))
    elif command == "run":
        site, instance_type, region = args
        r = client(region).run_instances(
            ImageId="ami-12c6146b", InstanceType=instance_type, MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "meridian:site", "Value": site}]}],
        )
        print(r["Instances"][0]["InstanceId"])
    elif command == "terminate":
        region = args[1] if len(args) > 1 else "us-east-1"
        client(region).terminate_instances(InstanceIds=[args[0]])
        print("terminated")
    else:
        sys.exit("unknown command %r" % command)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        ctl(*sys.argv[2:])
