#!/usr/bin/env python3
"""Fails when a source file of the extension or the model (src/, model/src/) is over 600 lines, or a
function there is over 80 lines. Tests (src/pg_tests/, tests.rs, #[cfg(test)] modules) are left out, and
so are the declarative tables named in DECLARATIVE (one definition per entry, nothing to split).
Run by the lint step of scripts/test.sh.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 600
MAX_FN_LINES = 80
# (file, function): the settings' definitions, one register call per setting
DECLARATIVE = {("src/gucs.rs", "init")}
FN = re.compile(r'^(\s*)(?:pub(?:\([\w:]+\))? )?(?:const )?(?:unsafe )?(?:extern "C-unwind" )?fn (\w+)')


def sources():
    for base in ("src", "model/src"):
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


def long_functions(relative, lines):
    for start, line in enumerate(lines):
        if re.match(r"\s*#\[cfg\(test\)\]", line):
            return  # the rest of the file is its test module
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
        test_at = next((i for i, l in enumerate(lines) if re.match(r"\s*#\[cfg\(test\)\]", l)), len(lines))
        if test_at > MAX_FILE_LINES:
            problems.append(f"{relative}: {test_at} lines before its tests (at most {MAX_FILE_LINES})")
        for name, length in long_functions(relative, lines):
            problems.append(f"{relative}: fn {name} has {length} lines (at most {MAX_FN_LINES})")
    for p in problems:
        print(p)
    if not problems:
        print(f"no file over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
