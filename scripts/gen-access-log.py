#!/usr/bin/env python3
"""Writes a synthetic access log in the combined format, for `tollgate simulate`.

Each line is nginx's `combined` plus two quoted fields, X-Forwarded-For and
X-API-Key (replay them with `--field x-forwarded-for --field x-api-key`):

  10.0.3.7 - - [01/May/2024:00:00:00 +0000] "GET /api/items/42 HTTP/1.1" 200 512 "-" "gen/1" "-" "k37"

Callers are drawn from a Zipf-like distribution (a few heavy, many light),
each with a fixed IP and, for most, an API key; about one request in fifty
is a login POST, one in a hundred a health check. Times start at --start and
advance evenly at --rate lines per second (whole seconds, as nginx logs).
The same --seed gives the same file.

  scripts/gen-access-log.py --lines 1000000 --out /tmp/access.log
  scripts/gen-access-log.py --lines 10000000 --gz --out /tmp/access.log.gz
"""

import argparse
import gzip
import itertools
import random
import sys
import time

MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def clf_time(epoch):
    t = time.gmtime(epoch)
    return "%02d/%s/%04d:%02d:%02d:%02d +0000" % (
        t.tm_mday, MONTHS[t.tm_mon - 1], t.tm_year, t.tm_hour, t.tm_min, t.tm_sec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=100_000, help="lines to write (default 100000)")
    ap.add_argument("--identities", type=int, default=5_000, help="distinct callers (default 5000)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--rate", type=float, default=300.0, help="requests per second of log time (default 300)")
    ap.add_argument("--start", type=int, default=1714521600, help="first second, epoch (default 2024-05-01T00:00Z)")
    ap.add_argument("--zipf", type=float, default=1.1, help="skew of the callers (default 1.1)")
    ap.add_argument("--gz", action="store_true", help="gzip the output")
    ap.add_argument("--out", default="-", help="file to write (default stdout)")
    a = ap.parse_args()

    rnd = random.Random(a.seed)
    n = max(1, a.identities)
    weights = [1.0 / (i + 1) ** a.zipf for i in range(n)]
    # Per caller: the prefix up to the time, and the quoted key field.
    ips = ["10.%d.%d.%d" % ((i >> 16) & 255, (i >> 8) & 255, i & 255 or 1) for i in range(n)]
    keys = ['"k%d"' % i if i % 10 != 9 else '"-"' for i in range(n)]
    prefixes = ["%s - - [" % ip for ip in ips]

    if a.out == "-":
        out = sys.stdout.buffer
    elif a.gz:
        out = gzip.open(a.out, "wb", compresslevel=3)
    else:
        out = open(a.out, "wb")

    chunk = 50_000
    written = 0
    second = -1
    stamp = ""
    while written < a.lines:
        k = min(chunk, a.lines - written)
        callers = rnd.choices(range(n), weights=weights, k=k)
        kinds = [rnd.random() for _ in range(k)]
        items = [rnd.randrange(1000) for _ in range(k)]
        lines = []
        for j in range(k):
            i = written + j
            s = a.start + int(i / a.rate)
            if s != second:
                second = s
                stamp = clf_time(s)
            c = callers[j]
            r = kinds[j]
            if r < 0.02:
                req, status = "POST /api/auth/login HTTP/1.1", "200"
            elif r < 0.03:
                req, status = "GET /health HTTP/1.1", "200"
            else:
                req, status = "GET /api/items/%d HTTP/1.1" % items[j], "200"
            lines.append('%s%s] "%s" %s 512 "-" "gen/1" "-" %s\n' % (prefixes[c], stamp, req, status, keys[c]))
        out.write("".join(lines).encode())
        written += k
    if out is not sys.stdout.buffer:
        out.close()


if __name__ == "__main__":
    main()
