#!/usr/bin/env python3
"""Fails when a dashboard or alert rule names a metric, or a label, the binaries do not export.

    tools/check_metric_names.py --exposition FILE [--exposition FILE ...] QUERY_FILE...

Each --exposition FILE is Prometheus text exposition scraped from a real binary (or printed by
one: `teifleet-operator --print-metrics`); tests/observability/run.sh gathers them from the debug
binaries on loopback, so the names come from the code that registers them, never from a list
typed here. Each QUERY_FILE is a Grafana dashboard (.json: every `expr`, and every templating
`query`) or a Prometheus rule file (.yaml: every `expr`).

What is checked, per PromQL expression:
- every metric name is a sample name of some exposition. Names are compared as Prometheus stores
  them: a histogram `foo` is queried as `foo_bucket`, `foo_sum` and `foo_count` (the exposition
  carries those sample names), so a bare `foo` is reported, with a hint;
- every label in a metric's matchers is a label of that metric's samples, `le` included for
  `_bucket`, or a target label the scrape adds (TARGET_LABELS);
- every label in `by`, `without`, `on`, `ignoring`, `group_left`, `group_right` and in Grafana's
  `label_values(..., label)` is a label of one of the expression's metrics, or a target label.
Label values are not checked: most (an outcome, a code) exist only once a call ended that way.

TEI's `te_*` series reach Prometheus through the sidecar's `/upstream/metrics`, passed on
unchanged; the exposition given for them is the TEI simulator's (tei-sim exports TEI 1.9's names,
docs/metrics.md). Its own `te_sim_*` series exist only in the simulator, never in a real TEI, so
naming one is an error here.

Exit status 0 when every name is found, 1 when one is not (each printed with where it is), 2 on
bad input (a file with no expression in it, an expression this cannot read).
"""

import argparse
import json
import re
import sys

# Labels Prometheus adds to every series it scrapes from a pod through Kubernetes service
# discovery (what a PodMonitor or ServiceMonitor configures), beside `job` and `instance`.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service"}
# Series only the simulator exports: never in a real TEI.
SIMULATOR_ONLY = re.compile(r"^te_sim_")

KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2"}
# Aggregations, which may be followed by `by (...)` instead of their parenthesis.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile", "limitk", "limit_ratio"}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}

TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<number>0x[0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?(?:\d+(?:ms|[smhdwy]))*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<variable>\$\{[^}]*\}|\$\w+)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}\[\]@:])
    """,
    re.VERBOSE,
)


class Unreadable(Exception):
    pass


def tokens(expr):
    position = 0
    out = []
    while position < len(expr):
        match = TOKEN.match(expr, position)
        if not match:
            raise Unreadable(f"cannot read {expr[position:position + 20]!r}")
        position = match.end()
        kind = match.lastgroup
        if kind not in ("space", "comment"):
            out.append((kind, match.group()))
    return out


def references(expr):
    """(metric, matcher labels) pairs and the labels of label lists, in `expr`."""
    toks = tokens(expr)
    metrics, grouping = [], []
    i = 0

    def label_list(i):
        # toks[i] is "(": the labels up to ")".
        labels = []
        i += 1
        while i < len(toks) and toks[i][1] != ")":
            if toks[i][0] == "ident":
                labels.append(toks[i][1])
            i += 1
        return labels, i + 1

    def matchers(i):
        # toks[i] is "{": label names up to "}".
        labels = []
        i += 1
        while i < len(toks) and toks[i][1] != "}":
            if toks[i][0] == "ident" and i + 1 < len(toks) and toks[i + 1][1] in ("=", "!=", "=~", "!~"):
                labels.append(toks[i][1])
            i += 1
        return labels, i + 1

    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "op" and text == "[":
            # A range or a subquery: durations and Grafana's $__rate_interval, no names.
            while i < len(toks) and toks[i][1] != "]":
                i += 1
            i += 1
        elif kind == "op" and text == "{":
            labels, i = matchers(i)
            if "__name__" in labels:
                raise Unreadable("a selector by __name__: name the metric instead")
            raise Unreadable("a selector without a metric name")
        elif kind == "ident" and text in LABEL_LIST_KEYWORDS:
            if following == "(":
                labels, i = label_list(i + 1)
                grouping.extend(labels)
            else:
                i += 1
        elif kind == "ident" and following == "(":
            i += 1  # a function or an aggregation
        elif kind == "ident" and (text.lower() in KEYWORDS or text in AGGREGATIONS):
            i += 1
        elif kind == "ident":
            labels = []
            i += 1
            if i < len(toks) and toks[i][1] == "{":
                labels, i = matchers(i)
            metrics.append((text, labels))
        else:
            i += 1
    return metrics, grouping


def grafana_query(query):
    """A templating query as (PromQL, extra grouping labels), or None for one that is not PromQL."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_]\w*)\s*\)\s*", query, re.S)
    if match:
        return match.group(1), [match.group(2)]
    match = re.fullmatch(r"\s*(?:query_result|metrics)\((.*)\)\s*", query, re.S)
    if match:
        return match.group(1), []
    match = re.fullmatch(r"\s*label_values\(\s*([a-zA-Z_]\w*)\s*\)\s*", query)
    if match:
        return None  # a label across every metric
    return None


def dashboard_queries(path):
    with open(path) as f:
        dashboard = json.load(f)
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            title = node.get("title", where)
            if isinstance(node.get("expr"), str):
                found.append((f"{path}: panel {title!r}", node["expr"], []))
            if node.get("type") == "query" and "name" in node:
                query = node.get("query")
                if isinstance(query, dict):
                    query = query.get("query")
                if isinstance(query, str):
                    parsed = grafana_query(query)
                    if parsed:
                        found.append((f"{path}: variable {node['name']!r}", parsed[0], parsed[1]))
            for value in node.values():
                walk(value, title)
        elif isinstance(node, list):
            for value in node:
                walk(value, where)

    walk(dashboard, "")
    return found


def rule_queries(path):
    """Every `expr` of a rule file: stdlib has no YAML reader, so this reads the two forms an
    `expr` takes in one (a plain one-line value, or a `|`/`>` block), and counts the rules to
    make sure it found one `expr` for each."""
    with open(path) as f:
        lines = f.read().splitlines()
    found, rules, name = [], 0, "?"
    i = 0
    while i < len(lines):
        line = lines[i]
        rule = re.match(r"\s*-\s*(alert|record):\s*(\S+)", line)
        if rule:
            rules += 1
            name = rule.group(2)
        match = re.match(r"(\s*)(?:-\s*)?expr:\s*(.*)$", line)
        if match:
            indent, value = len(match.group(1)), match.group(2).strip()
            if re.fullmatch(r"[|>][-+]?", value):
                body = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    body.append(lines[i])
                    i += 1
                found.append((f"{path}: {name}", "\n".join(body), []))
                continue
            if value[:1] in ("'", '"'):
                value = json.loads(value) if value[0] == '"' else value[1:-1].replace("''", "'")
            found.append((f"{path}: {name}", value, []))
        i += 1
    if len(found) != rules:
        raise Unreadable(f"{path}: {rules} rules but {len(found)} expressions read")
    return found


def exposition(paths):
    """Sample name -> its label names, across every file."""
    series = {}
    sample = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+")
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.strip() or line.startswith("#"):
                    continue
                match = sample.match(line)
                if not match:
                    raise Unreadable(f"{path}: cannot read the sample {line.strip()!r}")
                labels = set(re.findall(r'([a-zA-Z_]\w*)="', match.group(3) or ""))
                series.setdefault(match.group(1), set()).update(labels)
    return series


def check(queries, series):
    missing, found = [], set()
    for where, expr, extra_grouping in queries:
        try:
            metrics, grouping = references(expr)
        except Unreadable as e:
            raise Unreadable(f"{where}: {e} in {expr!r}") from None
        known_labels = set(TARGET_LABELS)
        for name, labels in metrics:
            if SIMULATOR_ONLY.match(name):
                missing.append(f"{where}: {name} is the TEI simulator's own, no real TEI exports it")
                continue
            if name not in series:
                hint = ""
                if f"{name}_bucket" in series:
                    hint = f" (a histogram: query {name}_bucket, {name}_sum or {name}_count)"
                missing.append(f"{where}: metric {name} is not exported{hint}")
                continue
            found.add(name)
            known_labels |= series[name]
            for label in labels:
                if label not in series[name] and label not in TARGET_LABELS:
                    missing.append(f"{where}: {name} has no label {label!r} (it has {sorted(series[name])})")
        for label in grouping + extra_grouping:
            if label not in known_labels:
                missing.append(f"{where}: label {label!r} is on none of {sorted({m for m, _ in metrics})}")
    return found, missing


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exposition", action="append", required=True, help="scraped /metrics text")
    parser.add_argument("queries", nargs="+", help="Grafana dashboards (.json) and rule files (.yaml)")
    args = parser.parse_args()
    try:
        series = exposition(args.exposition)
        queries = []
        for path in args.queries:
            these = dashboard_queries(path) if path.endswith(".json") else rule_queries(path)
            if not these:
                raise Unreadable(f"{path}: no expression found")
            queries.extend(these)
        found, missing = check(queries, series)
    except (Unreadable, OSError, json.JSONDecodeError) as e:
        print(f"check_metric_names: {e}", file=sys.stderr)
        return 2
    print(
        f"check_metric_names: {len(queries)} expressions in {len(args.queries)} files name {len(found)} "
        f"metrics, all among the {len(series)} exported sample names"
        if not missing
        else f"check_metric_names: {len(queries)} expressions name {len(found)} exported metrics; "
        f"{len(missing)} not exported:"
    )
    if found:
        print(f"  found: {', '.join(sorted(found))}")
    for line in missing:
        print(f"  {line}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
