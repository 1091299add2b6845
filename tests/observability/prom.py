#!/usr/bin/env python3
"""Questions to a real Prometheus server's HTTP API, for tests/observability/run.sh.

    prom.py URL up TIMEOUT
        Waits until Prometheus answers /-/ready and every scrape target is up (each exposition
        read and parsed by Prometheus itself); fails naming the targets that are not.
    prom.py URL quiet ALERT POOL TIMEOUT
        Waits until Prometheus has scraped calls of POOL, answered OK, with a rate over them (the
        rule's denominator exists), then for a rule evaluation after that; then fails unless ALERT
        is inactive for every pool (neither pending nor firing) and its rule evaluates healthily.
    prom.py URL firing ALERT POOL TIMEOUT
        Waits until ALERT fires for POOL (`state: firing` in /api/v1/alerts), printing after how
        long it was first seen pending and firing; fails if it is then active for any other pool,
        or after TIMEOUT seconds, with Prometheus' view of the rule, of the series it reads and of
        the targets.

A wait polls every 0.2 s and ends on the state it waits for: nothing sleeps a fixed time and then
asserts. Exit status 0 on the state asked for, 1 otherwise.
"""

import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone

POLL = 0.2


def get(base, path, **params):
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"{path}: {body}")
    return body["data"]


def query(base, expr):
    return get(base, "/api/v1/query", query=expr)["result"]


def stamp(text):
    """Prometheus' RFC 3339 times carry nanoseconds; Python reads microseconds."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text}")
    base = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return base.timestamp() + float("0." + (m[2] or "0"))


def rule(base, alert):
    for group in get(base, "/api/v1/rules", type="alert")["groups"]:
        for r in group["rules"]:
            if r["name"] == alert:
                return r
    raise RuntimeError(f"Prometheus has no rule named {alert}: were the rules loaded?")


def alerts(base, alert):
    return [a for a in get(base, "/api/v1/alerts")["alerts"] if a["labels"].get("alertname") == alert]


def show(v):
    return ", ".join(f"{s['metric']} = {s['value'][1]}" for s in v) or "(no series)"


def view(base, alert, pool):
    """Prometheus' own view, printed when a wait fails."""
    r = rule(base, alert)
    print(f"--- Prometheus' view: rule {alert}: state {r['state']}, health {r['health']}"
          f"{', error ' + r['lastError'] if r.get('lastError') else ''}, last evaluated {r.get('lastEvaluation')}",
          file=sys.stderr)
    print(f"its expression now: {show(query(base, r['query']))}", file=sys.stderr)
    print(f"its alerts: {r['alerts']}", file=sys.stderr)
    by = "sum by (namespace, pool, outcome) (teifleet_requests_total)"
    print(f"{by}: {show(query(base, by))}", file=sys.stderr)
    by = "sum by (namespace, pool, outcome) (rate(teifleet_requests_total[5m]))"
    print(f"{by}: {show(query(base, by))}", file=sys.stderr)
    for t in get(base, "/api/v1/targets")["activeTargets"]:
        print(f"target {t['scrapeUrl']}: {t['health']} {t['lastError']}", file=sys.stderr)


def wait_up(base, timeout):
    end = time.monotonic() + timeout
    targets = []
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=5) as answer:
                ready = answer.status == 200
        except (urllib.error.URLError, ConnectionError):
            ready = False
        if ready:
            targets = get(base, "/api/v1/targets")["activeTargets"]
            if targets and all(t["health"] == "up" for t in targets):
                for t in targets:
                    print(f"Prometheus scrapes {t['scrapeUrl']}: up")
                return 0
        time.sleep(POLL)
    print(f"Prometheus is not ready with every target up after {timeout} s", file=sys.stderr)
    for t in targets:
        print(f"target {t['scrapeUrl']}: {t['health']} {t['lastError']}", file=sys.stderr)
    return 1


def wait_quiet(base, alert, pool, timeout):
    end = time.monotonic() + timeout
    seen = None
    sel = f'pool="{pool}"'
    while time.monotonic() < end:
        ok = query(base, f'sum(teifleet_requests_total{{{sel}, outcome="ok"}}) >= 5')
        rate = query(base, f"sum(rate(teifleet_requests_total{{{sel}}}[5m])) > 0")
        if ok and rate:
            seen = time.time()
            break
        time.sleep(POLL)
    if seen is None:
        print(f"Prometheus saw no healthy traffic of pool {pool} within {timeout} s", file=sys.stderr)
        view(base, alert, pool)
        return 1
    while time.monotonic() < end:
        r = rule(base, alert)
        if r.get("lastEvaluation") and stamp(r["lastEvaluation"]) > seen:
            break
        time.sleep(POLL)
    else:
        print(f"Prometheus did not evaluate {alert} within {timeout} s", file=sys.stderr)
        view(base, alert, pool)
        return 1
    active = alerts(base, alert)
    if r["health"] != "ok" or r["state"] != "inactive" or active:
        print(f"{alert} is not quiet on the healthy run: rule state {r['state']}, health {r['health']}, "
              f"alerts {active}", file=sys.stderr)
        view(base, alert, pool)
        return 1
    calls = query(base, f"sum(teifleet_requests_total{{{sel}}})")
    print(f"healthy run: Prometheus has {calls[0]['value'][1]} calls of pool {pool} and a rate over "
          f"them, evaluated {alert} after that ({r['lastEvaluation']}): inactive, no alert")
    return 0


def wait_firing(base, alert, pool, timeout):
    start = time.monotonic()
    end = start + timeout
    pending = None
    while time.monotonic() < end:
        mine = [a for a in alerts(base, alert) if a["labels"].get("pool") == pool]
        states = {a["state"] for a in mine}
        now = time.monotonic() - start
        if "pending" in states and pending is None:
            pending = now
        if "firing" in states:
            others = [a for a in alerts(base, alert) if a["labels"].get("pool") != pool]
            if others:
                print(f"{alert} is active for other pools, which had no burst: {others}", file=sys.stderr)
                view(base, alert, pool)
                return 1
            a = next(a for a in mine if a["state"] == "firing")
            if pending is not None:
                seen = f"pending after {pending:.1f} s, "
            else:  # it went from nothing to firing between two polls (its `for:` passed unseen)
                seen = ""
            print(f"{alert} {seen}firing after {now:.1f} s: labels {a['labels']}, value {a['value']}, "
                  f"active since {a['activeAt']}")
            print(f"  summary: {a['annotations'].get('summary')}")
            return 0
        time.sleep(POLL)
    print(f"{alert} did not fire for pool {pool} within {timeout} s"
          f"{'' if pending is None else f' (pending after {pending:.1f} s)'}", file=sys.stderr)
    view(base, alert, pool)
    return 1


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    base, what, args = argv[1].rstrip("/"), argv[2], argv[3:]
    if what == "up" and len(args) == 1:
        return wait_up(base, float(args[0]))
    if what == "quiet" and len(args) == 3:
        return wait_quiet(base, args[0], args[1], float(args[2]))
    if what == "firing" and len(args) == 3:
        return wait_firing(base, args[0], args[1], float(args[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
