#!/usr/bin/env python3
"""Checks the house's floors: no import circle and no import up a floor in `src/`.

Usage: python3 scripts/check_layers.py [--show MODULE] [SRC]

Reads every `crate::` and `super::` path in `src/**/*.rs` (the `use` lines
and paths written inline), resolves each to the module that defines it, and
checks two rules (`docs/design/layout.md`):

1. **No circle among siblings.** Inside every module (the crate itself,
   `engine`, `engine::vllm`, `http`, ...), the graph of imports between its
   child modules has no cycle. A parent's own file (`mod.rs`) may use its
   children; children may use their parent's items.
2. **No import up a floor.** The crate's top-level modules stand on the
   floors of `FLOORS`, highest first; a module imports only modules on
   lower floors (or on its own floor, without a circle). A module missing
   from `FLOORS` is an error, so a new module is placed when it is added.

3. **Files stay readable.** No file is longer than `MAX_LINES` lines.
4. **The backend behind the route.** The modules of `BEHIND_ROUTE` (the
   HTTP surface and the task registry) import nothing of `engine`: they
   ask the text route, which re-exports the few engine words they use.

`--show MODULE` prints that module's graph of child imports (`crate` for the
top level). Exits 1 with one line per fault; prints a one-line summary when
the house is sound.
"""

import argparse
import collections
import re
import sys
from pathlib import Path

# The top-level modules by floor, highest first: the commands, the HTTP
# surface, the task registry, the text route, the engine seam and its
# backends, then the leaves every floor may use.
FLOORS = [
    ["serve", "register", "suite", "convert"],
    ["http"],
    ["tasks"],
    ["text_route"],
    ["engine"],
    ["prompt", "bases", "hub", "metrics", "settings", "client", "progress"],
    ["stats", "model_config", "rng", "base64"],
]

# The floors that reach the backend only through the route.
BEHIND_ROUTE = ["http", "tasks"]

# The longest a source file may be (docs/design/layout.md).
MAX_LINES = 700

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_0-9]+)+)")
# `pub use child::{A, B};` / `pub use self::child::A;` in a module's own file
REEXPORT = re.compile(r"\bpub use (?:self::)?([a-z_0-9]+)::(\{[^;]*\}|[A-Za-z_0-9]+);", re.S)
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)::\{", re.S)


def modules(src):
    """{module path tuple: file} for every module file under `src`."""
    out = {}
    for f in sorted(src.rglob("*.rs")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts == ["main"]:
            continue
        if parts[-1] == "mod":
            parts.pop()
        if parts == ["lib"]:
            parts = []
        out[tuple(parts)] = f
    return out


def group_paths(text, start):
    """The paths of a braced `use` group starting at `start` (after `{`)."""
    depth, i, token, out, stack = 1, start, "", [], []
    while i < len(text) and depth:
        c = text[i]
        if c == "{":
            stack.append(token.strip().rstrip(":").strip())
            token, depth = "", depth + 1
        elif c in ",}":
            name = token.strip()
            if name:
                out.append([p for p in stack if p] + [name])
            token = ""
            if c == "}":
                depth -= 1
                if stack:
                    stack.pop()
        else:
            token += c
        i += 1
    return out


def references(module, file):
    """Every module path `module`'s file names, absolute from the crate."""
    text = re.sub(r"//[^\n]*", "", file.read_text())

    def absolute(kind, parts):
        if kind == "crate":
            return parts
        base = list(module)
        if kind == "super":
            base = base[:-1]
            while parts and parts[0] == "super":
                parts, base = parts[1:], base[:-1]
        return base + parts

    out = []
    for m in PATH.finditer(text):
        parts = m.group(2).strip(":").split("::")
        out.append(absolute(m.group(1), parts))
    for m in USE_GROUP.finditer(text):
        for parts in group_paths(text, m.end()):
            parts = [p for seg in parts for p in seg.split("::") if p]
            parts = [p.split(" as ")[0].strip() for p in parts]
            out.append(absolute(m.group(1), parts))
    return out


def reexports(mods):
    """{(module, item): child module} for every item a module's file
    re-exports from one of its children, so an import through the parent
    counts as an import of the child that defines the item."""
    out = {}
    for module, file in mods.items():
        text = re.sub(r"//[^\n]*", "", file.read_text())
        for m in REEXPORT.finditer(text):
            child = module + (m.group(1),)
            if child not in mods:
                continue
            for item in re.findall(r"[A-Za-z_0-9]+", m.group(2)):
                out[(module, item)] = child
    return out


def graph(mods):
    """{module: {module it imports}} at module granularity (an item a
    parent re-exports counts as its defining child's)."""
    through = reexports(mods)
    g = collections.defaultdict(set)
    for module, file in mods.items():
        for ref in references(module, file):
            parts = list(ref)
            n = len(parts)
            while n and tuple(parts[:n]) not in mods:
                n -= 1
            if not n and not parts:
                continue
            target = tuple(parts[:n])
            if n < len(parts):
                target = through.get((target, parts[n]), target)
            if target != module and target in mods:
                g[module].add(target)
    return g


def children_graph(g, parent):
    """Imports between the children of `parent` (each child with its subtree)."""
    n = len(parent) + 1
    out = collections.defaultdict(set)
    for a, targets in g.items():
        if len(a) < n or a[:len(parent)] != parent:
            continue
        for b in targets:
            if len(b) >= n and b[:len(parent)] == parent and a[:n] != b[:n]:
                out[a[:n]].add(b[:n])
    return out


def cycles(g):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(g) | {w for ws in g.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def name(m):
    return "::".join(m) or "crate"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--show", help="print this module's graph of child imports")
    args = ap.parse_args()
    mods = modules(Path(args.src).resolve())
    g = graph(mods)
    if args.show:
        parent = () if args.show == "crate" else tuple(args.show.split("::"))
        for a, bs in sorted(children_graph(g, parent).items()):
            print(f"{name(a)} -> {' '.join(sorted(name(b) for b in bs))}")
        return 0

    faults = []
    parents = {m[:k] for m in mods for k in range(len(m))}
    for parent in sorted(parents):
        cg = children_graph(g, parent)
        for comp in cycles(cg):
            edges = "; ".join(f"{name(a)} -> {', '.join(name(b) for b in sorted(cg[a]) if b in comp)}"
                              for a in comp)
            faults.append(f"circle in {name(parent)}: {edges}")

    floor = {m: i for i, ms in enumerate(FLOORS) for m in ms}
    for top in sorted({m[0] for m in mods if m}):
        if top not in floor:
            faults.append(f"src/{top}: not placed on a floor; add it to FLOORS in {Path(__file__).name}")
    for a, bs in sorted(children_graph(g, ()).items()):
        for b in sorted(bs):
            if a[0] in floor and b[0] in floor and floor[b[0]] < floor[a[0]]:
                faults.append(f"{a[0]} (floor {floor[a[0]]}) imports {b[0]} (floor {floor[b[0]]}), "
                              "a floor above it: move the shared item down")
    for a, bs in sorted(children_graph(g, ()).items()):
        if a[0] in BEHIND_ROUTE and any(b[0] == "engine" for b in bs):
            faults.append(f"{a[0]} imports engine: ask the route (crate::text_route) instead")
    for module, file in sorted(mods.items()):
        lines = file.read_text().count("\n")
        if lines > MAX_LINES:
            shown = file.relative_to(Path(args.src).resolve().parent) if file.is_absolute() else file
            faults.append(f"{shown}: {lines} lines, over {MAX_LINES}; split it by job")
    for f in faults:
        print(f)
    if faults:
        return 1
    print(f"layers: {len(mods)} modules, no circle, no import up a floor, {', '.join(BEHIND_ROUTE)}"
          f" behind the route, none over {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
