#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks that every #include between folders of include/trainkit is allowed by the table of
docs/design.md ("Include edges between folders"): a header may include its own folder, the
top-level headers and the folders its row lists. Also checks the table itself: one row per
folder, no unknown folder, no cycle, and top-level headers include only top-level headers.

  check_layers.py           check; exit 1 listing each offending file:line and edge
  check_layers.py --list    print the folder-to-folder edges as they are, with counts
"""
import argparse
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include" / "trainkit"
DESIGN = ROOT.joinpath("docs/design.md")
HEADING = "## Include edges between folders"
UMBRELLA = "trainkit.hpp"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*["<]trainkit/([^">]+)[">]')


def read_table(text):
    """Returns {folder: set(allowed folders)} from the table under HEADING."""
    at = text.find(HEADING)
    if at < 0:
        raise SystemExit(f"check_layers: {DESIGN.relative_to(ROOT)} has no '{HEADING}' section")
    section = text[at + len(HEADING):]
    end = section.find("\n## ")
    if end >= 0:
        section = section[:end]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not line.lstrip().startswith("|"):
            continue
        folder, allowed = cells
        if folder in ("folder", "") or set(folder) <= set("-"):
            continue
        if folder in table:
            raise SystemExit(f"check_layers: the table lists folder '{folder}' twice")
        names = [] if allowed.startswith("(") else [a.strip() for a in allowed.split(",")]
        table[folder] = {a for a in names if a}
    if not table:
        raise SystemExit(f"check_layers: no table rows found under '{HEADING}'")
    return table


def includes():
    """Yields (header path relative to include/trainkit, line number, included path)."""
    for header in sorted(INCLUDE.rglob("*.hpp")):
        rel = header.relative_to(INCLUDE)
        for number, line in enumerate(header.read_text().splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if m:
                yield rel, number, m.group(1)


def folder_of(path):
    parts = pathlib.PurePosixPath(path).parts
    return parts[0] if len(parts) > 1 else None


def find_cycle(table):
    state = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(table.get(node, ())):
            if state.get(nxt) == 1:
                return stack + [node, nxt]
            if nxt not in state:
                found = visit(nxt, stack + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(table):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the edges as they are")
    args = parser.parse_args()

    if args.list:
        counts = collections.Counter()
        for rel, _, target in includes():
            src, dst = folder_of(rel), folder_of(target)
            if src and dst and src != dst:
                counts[src, dst] += 1
        for (src, dst), n in sorted(counts.items()):
            print(f"{src} -> {dst}: {n}")
        return 0

    table = read_table(DESIGN.read_text())
    folders = {p.name for p in INCLUDE.iterdir() if p.is_dir()}
    problems = []
    for folder in sorted(folders - set(table)):
        problems.append(f"folder include/trainkit/{folder} has no row in the table")
    for folder, allowed in sorted(table.items()):
        if folder not in folders:
            problems.append(f"the table has a row for '{folder}', which is not a folder")
        for a in sorted(allowed - folders):
            problems.append(f"the row of '{folder}' allows '{a}', which is not a folder")
        if folder in allowed:
            problems.append(f"the row of '{folder}' lists the folder itself")
    cycle = find_cycle(table)
    if cycle:
        problems.append("the table has a cycle: " + " -> ".join(cycle))

    for rel, number, target in includes():
        if rel.name == UMBRELLA and len(rel.parts) == 1:
            continue
        src, dst = folder_of(rel), folder_of(target)
        where = f"include/trainkit/{rel.as_posix()}:{number}"
        if not (INCLUDE / target).is_file():
            problems.append(f"{where}: includes trainkit/{target}, which does not exist")
        elif src is None and dst is not None:
            problems.append(f"{where}: a top-level header includes trainkit/{target}; top-level "
                            "headers include only each other")
        elif src and dst and src != dst and dst not in table.get(src, set()):
            problems.append(f"{where}: {src} -> {dst} (trainkit/{target}) is not an allowed edge; "
                            f"'{src}' may include: {', '.join(sorted(table.get(src, ()))) or 'no folder'}")

    if problems:
        print(f"check_layers: {len(problems)} problem(s) against the table in "
              f"{DESIGN.relative_to(ROOT)}:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"check_layers: every include follows the table ({len(table)} folders)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
