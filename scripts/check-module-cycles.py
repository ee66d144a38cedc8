#!/usr/bin/env python3
"""Fails when modules of the extension (src/) import each other in a circle, at any depth.

Every module is a file (src/a/b.rs, or src/a/b/mod.rs for a folder). Among the children of one module (the
top-level modules under the crate root, or the files of one folder), a child "imports" a sibling when its
source, or any of its descendants' source, names that sibling by a path: `crate::a::SIBLING`,
`super::SIBLING` (from the child's own file), `self::SIBLING` / `SIBLING::` (from the parent's `mod.rs`,
where siblings are named directly), or lists it in a `use ...::{...}` group. Imports of a sibling's
descendants count for the sibling. The crate root (`lib.rs`) and the tests (`pg_tests`, `tests.rs`, and
`#[cfg(test)]` modules) are left out. Prints every circle found (each once, from its first module in name
order), shortest first, and exits 1 if there is one.

    check-module-cycles.py [SRC]   SRC: the source folder (default: the repository's src/)
"""
import pathlib
import re
import sys

LEFT_OUT = {"lib", "pg_tests", "tests"}


def module_path(src, path):
    """The module path of a source file: src/a/b.rs and src/a/b/mod.rs are ("a", "b")."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    return tuple(parts)


def strip(text):
    """The source without comments and without #[cfg(test)] modules."""
    text = re.sub(r"//[^\n]*", "", text)
    out, skip_until = [], None
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"\s*#\[cfg\(test\)\]", line) and i + 1 < len(lines):
            m = re.match(r"(\s*)(pub(\(\w+\))? )?mod \w+ \{", lines[i + 1])
            if m:
                indent = m.group(1)
                i += 2
                while i < len(lines) and lines[i] != indent + "}":
                    i += 1
                i += 1
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def paths_named(text, here, parent):
    """Absolute module paths (tuples) a file at module path `here` names, as far as they can be read."""
    found = set()
    for m in re.finditer(r"\bcrate::((?:\w+::)*\w+)", text):
        found.add(tuple(m.group(1).split("::")))
    for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*\w+)", text):
        ups = m.group(1).count("super::")
        base = here[: len(here) - ups] if ups <= len(here) else ()
        found.add(base + tuple(m.group(2).split("::")))
    for m in re.finditer(r"\bself::((?:\w+::)*\w+)", text):
        found.add(here + tuple(m.group(1).split("::")))
    # `use PREFIX::{a, b::c}` groups
    for m in re.finditer(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\{([^}]*)\}", text):
        prefix = m.group(1).split("::")
        if prefix[0] == "crate":
            base = tuple(prefix[1:])
        elif prefix[0] == "self":
            base = here + tuple(prefix[1:])
        else:
            ups = prefix.count("super")
            base = here[: len(here) - ups] + tuple(p for p in prefix if p != "super")
        for part in m.group(2).split(","):
            names = re.findall(r"\w+", part)
            if names:
                found.add(base + (names[0],))
    # in a folder's mod.rs, a path may start with a child's name: `child::item`
    for m in re.finditer(r"(?<![:\w])(\w+)::", text):
        found.add(here + (m.group(1),))
    return found


def modules(src):
    files = {}
    for path in sorted(src.rglob("*.rs")):
        mp = module_path(src, path)
        if not mp or mp[0] in LEFT_OUT or mp[-1] in LEFT_OUT:
            continue
        files[mp] = strip(path.read_text())
    return files


def graphs(files):
    """For every module with children: {child: set of siblings it imports}."""
    children = {}
    for mp in files:
        children.setdefault(mp[:-1], set()).add(mp[-1])
    result = {}
    for parent, kids in children.items():
        graph = {k: set() for k in kids}
        for mp, text in files.items():
            if mp[: len(parent)] != parent or len(mp) <= len(parent):
                continue
            child = mp[len(parent)]
            for named in paths_named(text, mp, parent):
                if named[: len(parent)] == parent and len(named) > len(parent):
                    sibling = named[len(parent)]
                    if sibling in kids and sibling != child:
                        graph[child].add(sibling)
        result[parent] = graph
    return result


def circles_of(graph):
    names = sorted(graph)
    found = []
    for size in range(2, len(names) + 1):
        for start in names:
            stack = [[start]]
            while stack:
                path = stack.pop()
                for nxt in sorted(graph[path[-1]]):
                    if nxt == start and len(path) == size:
                        found.append(path + [start])
                    elif nxt not in path and len(path) < size and nxt > start:
                        stack.append(path + [nxt])
    return found


def main():
    src = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent / "src"
    all_graphs = graphs(modules(src))
    circles = []
    for parent in sorted(all_graphs):
        where = "::".join(("crate",) + parent)
        circles += [f"{where}: " + " -> ".join(c) for c in circles_of(all_graphs[parent])]
    for circle in circles:
        print("import circle in " + circle)
    if circles:
        return 1
    count = sum(len(g) for g in all_graphs.values())
    print(f"no import circle among {count} modules, at {len(all_graphs)} levels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
