"""Replaces a generated section of docs/performance.md: the text between a `<!-- NAME:begin -->`
and a `<!-- NAME:end -->` line, written atomically (a temporary file renamed over the doc)."""
import os
import sys

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "performance.md")


def write_section(name, title, text, docs=DOCS):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    doc = open(docs).read()
    if begin not in doc or end not in doc:
        sys.exit(f"{docs}: no {begin} ... {end} section to replace")
    head, rest = doc.split(begin, 1)
    tail = rest.split(end, 1)[1]
    tmp = docs + ".tmp"
    with open(tmp, "w") as f:
        f.write(head + begin + "\n" + title + "\n\n" + text + "\n" + end + tail)
    os.replace(tmp, docs)
