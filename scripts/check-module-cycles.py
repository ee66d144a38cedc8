#!/usr/bin/env python3
"""Fails when the crate's top-level modules (src/NAME.rs or src/NAME/) import each other in a circle.

A module "imports" another when its source names `crate::OTHER` (in a `use` or a path) or lists OTHER in
`use crate::{...}`. Submodules count for their top-level module; `lib.rs`, which wires them all, and the
tests (`pg_tests.rs`) are left out. Prints every circle found (each once, from its first module in name order), shortest first, and exits 1 if there is one.
"""
import itertools
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
LEFT_OUT = {"lib", "pg_tests"}


def top_level_modules():
    modules = {}
    for path in SRC.iterdir():
        name = path.stem if path.suffix == ".rs" else path.name
        if name in LEFT_OUT:
            continue
        files = [path] if path.is_file() else sorted(path.rglob("*.rs"))
        modules[name] = "\n".join(f.read_text() for f in files)
    return modules


def strip_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def imports(text, names):
    text = strip_comments(text)
    found = set(re.findall(r"crate::(\w+)", text))
    for group in re.findall(r"use crate::\{([^}]*)\}", text):
        found.update(re.findall(r"^\s*(\w+)", part)[0] for part in group.split(",") if part.strip())
    return found & names


def main():
    modules = top_level_modules()
    names = set(modules)
    graph = {name: imports(text, names) - {name} for name, text in modules.items()}
    circles = []
    for size in range(2, len(names) + 1):
        for start in sorted(names):
            stack = [[start]]
            while stack:
                path = stack.pop()
                for nxt in sorted(graph[path[-1]]):
                    if nxt == start and len(path) == size:
                        circle = path + [start]
                        circles.append(circle)
                    elif nxt not in path and len(path) < size and nxt > start:
                        stack.append(path + [nxt])
    for circle in circles:
        print("import circle: " + " -> ".join(circle))
    if circles:
        return 1
    print(f"no import circle among {len(names)} top-level modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
