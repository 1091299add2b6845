#!/usr/bin/env python3
"""Prints the ports a server of ours bound, read from its JSON log once it logs them.

    tools/bound-ports.py LOG MESSAGE KEY...

The test scripts start our servers (tei-sim, teifleet-multiplexer) on port 0 with
`--log-format json`: a port picked by the script and bound later by the server can be taken in
between. Each server logs one line with every address it bound once all its listeners are up
(tei-sim: "TEI simulator serving", fields addr and admin; the multiplexer: "multiplexer serving",
grpc_addr, admin_addr and http_addr). This waits for LOG's line whose message is MESSAGE and prints
the ports of its fields KEY..., space-separated; it exits 1 with the log on stderr if the line is
not there within --timeout seconds, or if a KEY is missing from it.
"""

import argparse
import json
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("message")
    parser.add_argument("keys", nargs="+", metavar="key")
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            with open(args.log, encoding="utf-8", errors="replace") as log:
                text = log.read()
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("message") != args.message:
                continue
            missing = [key for key in args.keys if not isinstance(event.get(key), str)]
            if missing:
                print(f"{args.log}: its '{args.message}' line has no {', '.join(missing)}: {line}", file=sys.stderr)
                return 1
            print(*(event[key].rsplit(":", 1)[1] for key in args.keys))
            return 0
        if time.monotonic() > deadline:
            print(f"no '{args.message}' line in {args.log} after {args.timeout:g} s; the log:", file=sys.stderr)
            sys.stderr.write(text)
            return 1
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
