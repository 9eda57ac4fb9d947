"""Replaces a generated section of docs/performance.md: the text between a `<!-- NAME:begin -->`
and a `<!-- NAME:end -->` line, written atomically (a temporary file renamed over the doc); and
names the machine a section was measured on."""
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


def machine():
    """The CPU as the sections' headers name it: its model name, core count and widest vector
    instruction set, e.g. "AMD EPYC (2 cores, AVX2, no AVX-512)" (the two kinds of machine this
    project is measured on differ about 4x in sgemm peak)."""
    cpu, flags = "?", set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and cpu == "?":
            cpu = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2"
    return f"{cpu} ({os.cpu_count()} cores, {isa})"
