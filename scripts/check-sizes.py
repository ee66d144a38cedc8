#!/usr/bin/env python3
"""Fails when a source file of the extension or the model (src/, model/src/) is over 600 lines, or a
function there is over 80 lines. Tests (src/pg_tests/, tests.rs, and every item marked #[cfg(test)]: a test
module, or a function, wherever it is in the file) are left out, and so are the declarative tables named
in DECLARATIVE (one definition per entry, nothing to split). Every file is read to its end.
Run by the lint step of scripts/test.sh.

    check-sizes.py [ROOT]   ROOT: a tree holding src/ (and model/src/); default: the repository
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 600
MAX_FN_LINES = 80
# (file, function): the settings' definitions, one register call per setting
DECLARATIVE = {("src/gucs.rs", "init")}
FN = re.compile(r'^(\s*)(?:pub(?:\([\w:]+\))? )?(?:const )?(?:unsafe )?(?:extern "C-unwind" )?fn (\w+)')


def sources():
    for base in ("src", "model/src"):
        if not (ROOT / base).is_dir():
            continue
        for path in sorted((ROOT / base).rglob("*.rs")):
            relative = path.relative_to(ROOT).as_posix()
            if "/pg_tests/" in relative or relative.endswith("tests.rs") or "/tests/" in relative:
                continue
            yield relative, path.read_text().split("\n")


def declaration_only(lines, start):
    """Whether the fn whose signature starts at `start` ends with `;` before any body opens."""
    for line in lines[start:]:
        if "{" in line:
            return False
        if line.rstrip().endswith(";"):
            return True
    return False


def item_end(lines, start):
    """The last line of the item that starts at `start`: a one-line item (`mod x;`, `use ...;`), or a block
    closed by a `}` at the item's own indentation."""
    indent = re.match(r"\s*", lines[start]).group(0)
    for end in range(start, len(lines)):
        if end == start and lines[start].rstrip().endswith(";"):
            return end
        if end > start and lines[end] == indent + "}":
            return end
        if end == start and lines[start].rstrip().endswith("}"):
            return end
    return len(lines) - 1


def test_lines(lines):
    """The line numbers of every item marked #[cfg(test)] (the attribute, the item's other attributes and
    the item itself)."""
    found = set()
    for at, line in enumerate(lines):
        if not re.match(r"\s*#\[cfg\(test\)\]", line):
            continue
        start = at + 1
        while start < len(lines) and re.match(r"\s*#\[", lines[start]):
            start += 1
        if start < len(lines):
            found.update(range(at, item_end(lines, start) + 1))
    return found


def long_functions(relative, lines, tests):
    for start, line in enumerate(lines):
        if start in tests:
            continue
        m = FN.match(line)
        if not m or (relative, m.group(2)) in DECLARATIVE:
            continue
        if declaration_only(lines, start):
            continue  # a trait's method without a body
        end = next((e for e in range(start + 1, len(lines)) if lines[e] == m.group(1) + "}"), start)
        if end - start + 1 > MAX_FN_LINES:
            yield m.group(2), end - start + 1


def main():
    problems = []
    for relative, lines in sources():
        tests = test_lines(lines)
        length = len([i for i in range(len(lines)) if i not in tests])
        if length > MAX_FILE_LINES:
            problems.append(f"{relative}: {length} lines besides its tests (at most {MAX_FILE_LINES})")
        for name, length in long_functions(relative, lines, tests):
            problems.append(f"{relative}: fn {name} has {length} lines (at most {MAX_FN_LINES})")
    for p in problems:
        print(p)
    if not problems:
        print(f"no file over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
