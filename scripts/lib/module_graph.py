#!/usr/bin/env python3
"""Module dependency graph of the workspace's crates, and the cycles in it.

For every crate under crates/, each source file is a module (src/a/b.rs and src/a/b/mod.rs are
`a::b`). A path written in a file (`crate::x::y`, `super::z`, `use crate::{x, y::z}`) is an edge
from the file's module to the deepest module the path names. Edges are then lifted to sibling
level: at every module directory, an edge between two of its child subtrees is an edge between
those children. A cycle among siblings (a::b uses a::c, a::c uses a::b, directly or through other
siblings) is reported; a parent and its own children referring to each other is not a cycle (the
parent declares them). Test modules (`tests.rs`, `mod tests`) are left out.

Usage: module_graph.py [CRATES_DIR]   exit status 1 when a crate has a module cycle.
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_path(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def strip_tests(text):
    """The text before a `#[cfg(test)] mod tests` block (such blocks end the file here)."""
    m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+" + IDENT + r"\s*\{", text)
    return text[: m.start()] if m else text


def expand(prefix, text, i):
    """Paths inside a `{…}` group starting at text[i] (after `prefix::`)."""
    depth, start, out = 0, i + 1, []
    j = i
    while j < len(text):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        j += 1
    body = text[i + 1 : j]
    parts, depth, cur = [], 0, ""
    for c in body:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    for p in parts:
        p = p.strip()
        m = re.match(r"(" + IDENT + r"(?:::" + IDENT + r")*)", p)
        if m:
            out.append(prefix + m.group(1).split("::"))
    return out


def references(text, here):
    """Module paths (as lists of segments from the crate root) that `text` names."""
    refs = []
    for m in re.finditer(r"\b(crate|super)((?:::super)*)::", text):
        base = [] if m.group(1) == "crate" else list(here[:-1])
        for _ in range(m.group(2).count("super")):
            base = base[:-1]
        rest = text[m.end():]
        if rest.startswith("{"):
            refs.extend(expand(base, text, m.end()))
        else:
            p = re.match(IDENT + r"(?:::" + IDENT + r")*", rest)
            if p:
                refs.append(base + p.group(0).split("::"))
    return refs


def crate_graph(crate_dir):
    src = os.path.join(crate_dir, "src")
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs") and n != "tests.rs":
                p = os.path.join(root, n)
                files[module_path(src, p)] = p
    modules = set(files)
    edges = set()
    for mod, path in files.items():
        is_dir_module = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
        here = mod + ("_",) if is_dir_module else mod
        text = strip_tests(open(path, encoding="utf-8", errors="replace").read())
        # Comments (doc links included) are no dependency.
        text = re.sub(r"//[^\n]*", "", text)
        for ref in references(text, here):
            target = ()
            for k in range(len(ref), 0, -1):
                if tuple(ref[:k]) in modules:
                    target = tuple(ref[:k])
                    break
            if target != mod:
                edges.add((mod, target))
    return modules, edges


def sibling_cycles(modules, edges):
    cycles = []
    parents = {m[:-1] for m in modules if m} | {()}
    for parent in sorted(parents):
        kids = {}
        for a, b in edges:
            if a[: len(parent)] != parent or b[: len(parent)] != parent:
                continue
            if len(a) <= len(parent) or len(b) <= len(parent):
                continue
            ca, cb = a[len(parent)], b[len(parent)]
            if ca != cb:
                kids.setdefault(ca, set()).add(cb)
        # Tarjan's strongly connected components.
        index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in kids.get(v, ()):
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
                    out.append(sorted(comp))

        for v in sorted(kids):
            if v not in index:
                visit(v)
        for comp in out:
            cycles.append((parent, comp))
    return cycles


def main():
    crates = sys.argv[1] if len(sys.argv) > 1 else "crates"
    bad = 0
    for name in sorted(os.listdir(crates)):
        d = os.path.join(crates, name)
        if not os.path.isdir(os.path.join(d, "src")):
            continue
        modules, edges = crate_graph(d)
        cycles = sibling_cycles(modules, edges)
        print(f"{name}: {len(modules)} modules, {len(edges)} edges, "
              f"{'no module cycle' if not cycles else str(len(cycles)) + ' module cycle(s)'}")
        for parent, comp in cycles:
            where = "::".join(parent) or "crate root"
            print(f"  cycle under {where}: {' <-> '.join(comp)}")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
