#!/usr/bin/env python3
"""The example blocks of README.md and docs/*.md, produced by running docs/examples/*.sql.

    scripts/doc-examples.py --check PSQL CONNINFO   run every example file, fail if a block differs
    scripts/doc-examples.py --write PSQL CONNINFO   run them and rewrite the blocks

CONNINFO names a server (e.g. "host=/var/tmp/rate_limit-sock port=5515 user=postgres"); each example
file runs in a fresh database of its own (created and dropped here) with the extension.

An example file is SQL with directives on lines of their own:
    --@ block NAME      the statements that follow, up to the next block, form block NAME
    --@ hide            the next statement runs, but its output is not shown
Lines before the first block set up the session and are not shown. A statement ends at a line ending
with ';'. In a document, the fenced block after a line `<!-- example: NAME -->` is the block NAME: each
statement as written, then its output as psql prints it (aligned, no footer), every output line
prefixed with '-- '.
"""

import difflib
import pathlib
import re
import os
import subprocess
import sys

# notices (DROP ... IF EXISTS) are not part of any example
os.environ["PGOPTIONS"] = "-c client_min_messages=warning"

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.sql"))
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "@@example-statement@@"
DOC_MARKER = re.compile(r"^<!-- example: (\S+) -->$")


class Statement:
    def __init__(self, block, text, hidden):
        self.block, self.text, self.hidden, self.output = block, text, hidden, []


def parse(path):
    """The statements of an example file: (setup lines, [Statement])."""
    setup, statements, block, hidden, current = [], [], None, False, []
    for line in path.read_text().splitlines():
        if line.startswith("--@ block "):
            block = line.split(None, 2)[2].strip()
            continue
        if line.strip() == "--@ hide":
            hidden = True
            continue
        if block is None:
            setup.append(line)
            continue
        if not current and not line.strip():
            statements.append(Statement(block, "", True))  # a blank line between statements
            continue
        if not current and line.startswith("--"):
            statements.append(Statement(block, line, True))  # a comment of its own, shown in its place
            continue
        current.append(line)
        code = re.sub(r"--.*$", "", line).rstrip()
        if code.endswith(";") or (len(current) == 1 and line.startswith("\\")):
            statements.append(Statement(block, "\n".join(current), hidden))
            current, hidden = [], False
    if current:
        sys.exit(f"{path}: the last statement does not end with ';'")
    return setup, statements


def run(psql, conninfo, path):
    """Runs one example file in a fresh database; fills in each statement's output."""
    setup, statements = parse(path)
    database = "rate_limit_doc_" + path.stem
    admin = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", f"{conninfo} dbname=postgres"]
    subprocess.run(admin + ["-c", f"DROP DATABASE IF EXISTS {database}"], check=True)
    subprocess.run(admin + ["-c", f"CREATE DATABASE {database}"], check=True)
    try:
        script = ["\\set VERBOSITY default", "\\pset footer off", "\\pset pager off", "\\o /dev/null",
                  "CREATE EXTENSION rate_limit;", *setup, "\\o"]
        for i, s in enumerate(statements):
            script.append(f"\\echo {MARKER} {i}")
            if s.text and not s.text.startswith("--"):
                script.append(s.text)
        script.append(f"\\echo {MARKER} end")
        done = subprocess.run([psql, "-X", "-q", f"{conninfo} dbname={database}"],
                              input="\n".join(script) + "\n", text=True, check=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    finally:
        subprocess.run(admin + ["-c", f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"], check=True)
    current = None
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            index = line.split()[1]
            current = None if index == "end" else statements[int(index)]
        elif current is not None:
            current.output.append(re.sub(r"^psql:<stdin>:\d+: ", "", line))
        elif line.strip():
            sys.exit(f"{path}: output before the first block:\n{line}")
    return statements


def blocks(statements):
    """Block name -> its text."""
    out = {}
    for s in statements:
        lines = out.setdefault(s.block, [])
        lines.append(s.text)
        if not s.hidden:
            output = list(s.output)
            while output and not output[-1].strip():
                output.pop()
            lines.extend(("-- " + o).rstrip() for o in output)
    return {name: "\n".join(lines).strip("\n") for name, lines in out.items()}


def render(document, produced, used):
    """The document with every example block replaced by what was produced."""
    lines, out, i = document.read_text().splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        m = DOC_MARKER.match(lines[i])
        i += 1
        if not m:
            continue
        name = m.group(1)
        if name not in produced:
            sys.exit(f"{document}: no example file produces block {name}")
        used.add(name)
        if i >= len(lines) or lines[i] != "```sql":
            sys.exit(f"{document}: block {name} must be followed by a ```sql fence")
        end = lines.index("```", i + 1)
        out.append("```sql")
        out.extend(produced[name].splitlines())
        out.append("```")
        i = end + 1
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("--check", "--write"):
        sys.exit(__doc__)
    mode, psql, conninfo = sys.argv[1:]
    produced = {}
    for path in EXAMPLES:
        for name, text in blocks(run(psql, conninfo, path)).items():
            if name in produced:
                sys.exit(f"block {name} is produced twice")
            produced[name] = text
    used, differ = set(), False
    for document in DOCUMENTS:
        old = document.read_text()
        new = render(document, produced, used)
        if new == old:
            continue
        if mode == "--write":
            document.write_text(new)
            print(f"rewrote {document.relative_to(ROOT)}")
        else:
            differ = True
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), new.splitlines(True),
                f"{document.relative_to(ROOT)} (in the repository)",
                f"{document.relative_to(ROOT)} (produced by docs/examples)"))
    unused = sorted(set(produced) - used)
    if unused:
        sys.exit(f"blocks no document shows: {', '.join(unused)}")
    if differ:
        sys.exit("the documents' examples differ from what docs/examples/*.sql produce; "
                 "run scripts/doc-examples.py --write and review the change")
    print(f"{len(used)} example blocks match what docs/examples/*.sql produce")


if __name__ == "__main__":
    main()
