#!/usr/bin/env python3
"""A small HTTP proxy in front of an S3-compatible server, for Deltafin's object storage tests
and benchmarks (docs/object-storage.md, BENCHMARKS.md). Standard library only.

It forwards every request to --upstream and can, on the way back:
  --rate BYTES      cap the bandwidth of all response bodies together (one shared link, bytes/s)
  --latency-ms MS   wait this long before forwarding each request (a round trip)
  --fail-gets N     answer the first N ranged GETs with 503 SlowDown
  --short-gets N    then answer N ranged GETs with half of the bytes asked for
  --stall-gets N    then hold N ranged GETs for --stall-s seconds before answering
  --only SUFFIX     fault only GETs of keys ending in SUFFIX (e.g. experts.bin)
It prints "listening PORT" on its first line of standard output, then one line per faulted
request ("fault fail|short|stall RANGE"). Usage:
  s3proxy.py --upstream http://127.0.0.1:5000 [--port 0] [--rate 50000000] [--fail-gets 2]
"""
import argparse
import http.client
import http.server
import sys
import threading
import time
import urllib.parse

ARGS = None
LOCK = threading.Lock()
LINK = threading.Lock()
STATE = {"ranged": 0, "next_free": 0.0}


def fault_for_ranged_get():
    """The fault of the next ranged GET (None, 'fail', 'short' or 'stall')."""
    with LOCK:
        i = STATE["ranged"]
        STATE["ranged"] += 1
    a = ARGS
    if i < a.fail_gets:
        return "fail"
    if i < a.fail_gets + a.short_gets:
        return "short"
    if i < a.fail_gets + a.short_gets + a.stall_gets:
        return "stall"
    return None


def send_capped(wfile, body):
    """Writes body through the shared link of ARGS.rate bytes/s (no cap when 0)."""
    chunk = 16384
    for i in range(0, len(body), chunk):
        part = body[i:i + chunk]
        if ARGS.rate > 0:
            with LINK:
                now = time.monotonic()
                start = max(now, STATE["next_free"])
                STATE["next_free"] = start + len(part) / ARGS.rate
                wait = STATE["next_free"] - now
            if wait > 0:
                time.sleep(wait)
        wfile.write(part)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def forward(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        ranged = self.command == "GET" and "Range" in self.headers
        ranged = ranged and urllib.parse.urlsplit(self.path).path.endswith(ARGS.only)
        fault = fault_for_ranged_get() if ranged else None
        if fault:
            print("fault", fault, self.headers["Range"], flush=True)
        if ARGS.latency_ms:
            time.sleep(ARGS.latency_ms / 1000)
        if fault == "fail":
            msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        if fault == "stall":
            time.sleep(ARGS.stall_s)
        up = urllib.parse.urlsplit(ARGS.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        if fault == "short" and r.status == 206:
            data = data[: len(data) // 2]
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                self.send_header(k, v)
        length = r.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            send_capped(self.wfile, data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--rate", type=float, default=0)
    p.add_argument("--latency-ms", type=float, default=0)
    p.add_argument("--fail-gets", type=int, default=0)
    p.add_argument("--short-gets", type=int, default=0)
    p.add_argument("--stall-gets", type=int, default=0)
    p.add_argument("--stall-s", type=float, default=5)
    p.add_argument("--only", default="")
    ARGS = p.parse_args()
    srv = http.server.ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    srv.daemon_threads = True
    print("listening", srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
