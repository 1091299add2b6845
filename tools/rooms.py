#!/usr/bin/env python3
"""The multiplexer's rooms and the imports between them; any crate's import circles.

Reads a crate's `src/` (default `multiplexer/src`; several may be given), builds the graph of its
modules from the `crate::` and `super::` paths in their code (comments and `#[cfg(test)]` code
left out: tests may reach anywhere), and prints:
  - the circles of imports between modules (strongly connected components of more than one);
  - with `--no-circles`, exits 1 if any tree has one;
  - with `--check` (the multiplexer's tree), every import from a room to a room above it in ROOMS,
    and exits 1 if any, or any circle.

`make lint` runs `tools/rooms.py --check` on the multiplexer and `--no-circles` on every crate;
the issue notes count before and after with `tools/rooms.py <src>` on each tree.
"""

import argparse
import os
import re
import sys

# The multiplexer's rooms, lowest first: a room imports only from rooms before it.
ROOMS = ["vocab", "transport", "admission", "gate", "error", "report", "cache", "activator", "forward", "front", "sources", "run"]

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)(::\{([^}]*)\})?")


def module_of(src, file):
    rel = os.path.relpath(file, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def code_lines(text):
    """The file's lines of code: no comments, nothing from `#[cfg(test)]` on."""
    out = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#[cfg(test)]"):
            break
        if stripped.startswith("//"):
            continue
        out.append(line.split("//")[0])
    return out


def resolve(modules, segments):
    """The longest prefix of `segments` that names a module."""
    for end in range(len(segments), -1, -1):
        if tuple(segments[:end]) in modules:
            return tuple(segments[:end])
    return ()


def graph(src):
    files = []
    for root, _, names in os.walk(src):
        files += [os.path.join(root, n) for n in names if n.endswith(".rs")]
    modules = {module_of(src, f): f for f in files if not f.endswith("main.rs")}
    edges = {m: set() for m in modules}
    for module, file in modules.items():
        if file.endswith("tests.rs"):
            continue
        text = "\n".join(code_lines(open(file, encoding="utf-8").read()))
        # `use crate::a::{b, c::d}` spans lines: join the braces.
        text = re.sub(r"\{[^{}]*\}", lambda m: m.group(0).replace("\n", " "), text)
        for match in PATH.finditer(text):
            head, rest, _, group = match.groups()
            segments = rest.strip(":").split("::")
            if head == "super":
                parent = list(module[:-1])
                while segments and segments[0] == "super":
                    parent = parent[:-1]
                    segments = segments[1:]
                segments = parent + segments
            tails = [g.strip().split("::") for g in group.split(",") if g.strip()] if group else [[]]
            for tail in tails:
                target = resolve(modules, segments + [t for t in tail if t not in ("self", "*")])
                if target and target != module:
                    edges[module].add(target)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def name(module):
    return "::".join(module) or "lib"


def room(module):
    return module[0] if module else None


def report(src, check):
    """Prints `src`'s circles (and with `check`, its rooms' upward imports); true if it passes."""
    edges = graph(src)
    circles = cycles(edges)
    files = sum(1 for _ in edges)
    top = sorted({room(m) for m in edges if m})
    print(f"{src}: {files} modules, {len(top)} top-level modules or rooms")
    print(f"import circles between modules: {len(circles)}")
    for circle in circles:
        print("  " + " <-> ".join(name(m) for m in circle))
    room_edges = {(room(a), room(b)) for a, targets in edges.items() for b in targets if a and b and room(a) != room(b)}
    room_circles = cycles({r: {b for a, b in room_edges if a == r} for r in top})
    print(f"import circles between top-level modules or rooms: {len(room_circles)}")
    for circle in room_circles:
        print("  " + " <-> ".join(circle))
    if not check:
        return not circles
    rank = {r: i for i, r in enumerate(ROOMS)}
    upward = sorted(
        (name(a), name(b))
        for a, targets in edges.items()
        for b in targets
        if a and b and room(a) != room(b) and rank.get(room(b), -1) > rank.get(room(a), len(ROOMS))
    )
    unknown = sorted(r for r in top if r not in rank)
    for r in unknown:
        print(f"{r}: not a room in tools/rooms.py's ROOMS: place it")
    for a, b in upward:
        print(f"{a} imports {b}: a room above it")
    if upward or unknown or circles:
        return False
    print("every room imports only from rooms below it")
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", nargs="*", default=["multiplexer/src"])
    parser.add_argument("--check", action="store_true", help="fail on an import from a room to one above it")
    parser.add_argument("--no-circles", action="store_true", help="fail on an import circle in any tree")
    args = parser.parse_args()
    if args.check and len(args.src) != 1:
        parser.error("--check reads one tree: the multiplexer's rooms")
    passed = [report(src, args.check) for src in args.src]
    if (args.check or args.no_circles) and not all(passed):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
