#!/usr/bin/env python3
"""Renders the module tree of docs/ARCHITECTURE.md from the code, so that the map cannot go stale:
every file under runtime/ with the first line of its module doc (`//!`, or the first comment of a
CUDA source), between the markers

    <!-- generated:module-tree --> ... <!-- /generated -->

    python3 scripts/gen-architecture.py            # check: exit 1 and show what differs
    python3 scripts/gen-architecture.py --write    # rewrite the tree in place

Standard library only (CI runs the check on a fresh machine).
"""

import argparse
import difflib
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
MARK = re.compile(r"(<!-- generated:module-tree -->\n)(.*?)(<!-- /generated -->)", re.S)
WIDTH = 100


def summary(path):
    """The first sentence (or line) of a file's module doc, shortened to fit the tree."""
    prefix = "//!" if path.endswith(".rs") else "//"
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith(prefix) and not (prefix == "//" and line.startswith("///")):
                text = line[len(prefix):].strip()
                if text.startswith("#"):
                    continue  # a heading (lib.rs's crate title)
                if not text:
                    if lines:
                        break
                    continue
                lines.append(text)
            elif lines or line:
                break
    text = " ".join(lines)
    end = re.search(r"(?<=[a-z0-9)`])\. ", text)
    if end:
        text = text[: end.start() + 1]
    return text.rstrip(".")


def line(name, note):
    """One row of the tree: the name, then its note cut to the width."""
    room = WIDTH - max(len(name), 28) - 2
    if len(note) > room:
        note = note[: max(room - 3, 10)].rstrip() + "..."
    return f"{name:<28}  {note}".rstrip()


def tree(directory, indent=""):
    entries = sorted(os.listdir(directory), key=lambda e: (not os.path.isdir(os.path.join(directory, e)), e))
    entries = [e for e in entries if os.path.isdir(os.path.join(directory, e)) or e.endswith((".rs", ".cu"))]
    entries = [e for e in entries if e != "mod.rs"]  # its summary stands beside the folder
    out = []
    for i, e in enumerate(entries):
        last = i == len(entries) - 1
        path = os.path.join(directory, e)
        branch, child = ("└─ ", "   ") if last else ("├─ ", "│  ")
        if os.path.isdir(path):
            mod = os.path.join(path, "mod.rs")
            beside = path + ".rs"  # a module whose folder holds its children (optim.rs + optim/)
            note = summary(mod) if os.path.exists(mod) else summary(beside) if os.path.exists(beside) else ""
            out.append(line(f"{indent}{branch}{e}/", note))
            out.extend(tree(path, indent + child))
        else:
            out.append(line(f"{indent}{branch}{e}", summary(path)))
    return out


def render():
    return "```\nruntime/\n" + "\n".join(tree(os.path.join(ROOT, "runtime"))) + "\n```\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    if not MARK.search(doc):
        print("docs/ARCHITECTURE.md has no <!-- generated:module-tree --> block")
        return 1
    new = MARK.sub(lambda m: m.group(1) + render() + m.group(3), doc)
    if new == doc:
        print("docs/ARCHITECTURE.md: the module tree matches the code")
        return 0
    if args.write:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(new)
        print("rewrote docs/ARCHITECTURE.md")
        return 0
    sys.stdout.writelines(difflib.unified_diff(doc.splitlines(True), new.splitlines(True), DOC, DOC + " (generated)"))
    print("\nthe module tree differs from the code: run python3 scripts/gen-architecture.py --write")
    return 1


if __name__ == "__main__":
    sys.exit(main())
