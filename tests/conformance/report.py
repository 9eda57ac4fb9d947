"""Conformance report: onnxtrain and ONNX Runtime over ONNX 1.23's and 1.12's backend tests, one run.

Lays out ONNX 1.23's backend tests (tests/conformance/onnx_testdata.py, into the build folder
where ctest's fixture puts them), runs onnxtrain-conformance (C++) and tests/conformance/
ort_runner.py (ONNX Runtime, CPU provider, the same comparison) over both suites, and writes
docs/ops.md: the summary per suite and folder, the ai.onnx node-test pass rate of ONNX 1.23's
suite against the goal, one row per operator onnxtrain implements with both runtimes' counts
per suite, the ops the tests use that onnxtrain does not implement, and ONNX 1.23's failing
tests with their reasons (a manifest's `# fails:` line where there is one, else the runner's
message).

Usage (from the repository root, after building the onnxtrain-conformance target):
  .venv/bin/python tests/conformance/report.py [--build build/release] [--out docs/ops.md]
The results stay in BUILD/conformance-results/*.json; --reuse writes docs/ops.md from them
without running anything. onnxtrain's and ONNX Runtime's runners of a suite run side by side
(--jobs 1 runs one at a time).
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import onnx
import onnx.defs
import onnxruntime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tests", "conformance")
GOAL = 0.97  # of ONNX 1.23's ai.onnx node tests pass


@dataclass
class Suite:
    key: str  # file names: onnxtrain-<key>.json
    title: str
    data: str
    folders: list
    manifest: str


def suites(build: str) -> list:
    return [
        Suite("onnx123", f"ONNX {onnx.__version__}", os.path.join(build, f"onnx-{onnx.__version__}-testdata"),
              ["node", "light", "simple", "pytorch-converted", "pytorch-operator"],
              os.path.join(HERE, "expected_pass_onnx123.txt")),
        Suite("onnx112", "ONNX 1.12", "/usr/share/libonnx-testdata/data",
              ["node", "simple", "pytorch-converted", "pytorch-operator"],
              os.path.join(HERE, "expected_pass.txt")),
    ]


# ---- running --------------------------------------------------------------------------------

def run_suites(build: str, results_dir: str, jobs: int) -> None:
    runner = os.path.join(build, "tests", "onnxtrain-conformance")
    if not os.path.exists(runner):
        raise SystemExit(f"error: {runner} not found: build the onnxtrain-conformance target first")
    subprocess.run([sys.executable, os.path.join(HERE, "onnx_testdata.py"), suites(build)[0].data], check=True)
    os.makedirs(results_dir, exist_ok=True)
    for suite in suites(build):
        folders = ",".join(suite.folders)
        commands = {
            "onnxtrain": [runner, "--data", suite.data, "--folders", folders, "--manifest", suite.manifest,
                          "--results", os.path.join(results_dir, f"onnxtrain-{suite.key}.json")],
            "ort": [sys.executable, os.path.join(HERE, "ort_runner.py"), "--data", suite.data,
                    "--folders", folders, "--results", os.path.join(results_dir, f"ort-{suite.key}.json")],
        }
        running = []
        for name, command in commands.items():
            start = time.monotonic()
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            running.append((name, proc, start))
            if jobs == 1:
                finish(suite, *running.pop())
        for job in running:
            finish(suite, *job)


def finish(suite: Suite, name: str, proc: subprocess.Popen, start: float) -> None:
    """Waits for one runner and prints its verdict lines (failures stay in the results file)."""
    output = proc.communicate()[0]
    if proc.returncode not in (0, 1):  # 1: onnxtrain's manifest check failed; still results
        raise SystemExit(f"error: {name} over {suite.title} exited {proc.returncode}:\n{output[-3000:]}")
    for line in output.splitlines():
        if line.startswith(("REGRESSION", "UNEXPLAINED", "conformance:", "ort conformance:")):
            print(f"{suite.title} {name}: {line}")
    print(f"{suite.title} {name}: {time.monotonic() - start:.0f} s", flush=True)


# ---- reading --------------------------------------------------------------------------------

def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def known_failures(manifest: str) -> dict:
    """The manifest's `# fails: ID  reason` lines (format: tests/conformance/runner.cpp)."""
    reasons = {}
    with open(manifest) as f:
        for line in f:
            m = re.match(r"# fails:\s*(\S+)\s+(.*\S)", line)
            if m:
                reasons[m.group(1)] = m.group(2)
    return reasons


def schema_versions() -> dict:
    """(domain "ai.onnx"-style, op) -> the since_versions of ONNX's schemas for it."""
    versions = defaultdict(set)
    for s in onnx.defs.get_all_schemas_with_history():
        versions[(s.domain or "ai.onnx", s.name)].add(s.since_version)
    return {k: sorted(v) for k, v in versions.items()}


def split_op(op: str):
    """"ai.onnx.preview.training.Adam" -> ("ai.onnx.preview.training", "Adam")."""
    domain, _, name = op.rpartition(".")
    return domain, name


# ---- formatting -----------------------------------------------------------------------------

FLOATS = ["float16", "float32", "float64", "bfloat16"]
SIGNED = ["int8", "int16", "int32", "int64"]
UNSIGNED = ["uint8", "uint16", "uint32", "uint64"]


def types_text(types: set) -> str:
    if not types:
        return "(from an attribute)"
    parts, rest = [], set(types)
    for group, name in ((FLOATS + SIGNED + UNSIGNED, "numeric"), (FLOATS, "floats"),
                        (SIGNED, "int8–64"), (UNSIGNED, "uint8–64")):
        if rest.issuperset(group):
            parts.append(name)
            rest -= set(group)
    order = FLOATS + SIGNED + UNSIGNED + ["bool"]
    parts += sorted(rest, key=lambda t: order.index(t) if t in order else len(order))
    return ", ".join(parts)


def versions_text(rows: list, schemas: list) -> str:
    """The schema versions the rows serve, then those they do not ("; not 19, 21")."""
    if not schemas:  # onnxtrain's own ops
        return ", ".join(f"{r['since']}–{r['until']}" if r["until"] != r["since"] else str(r["since"]) for r in rows)
    served = [v for v in schemas if any(r["since"] <= v <= r["until"] for r in rows)]
    missing = [v for v in schemas if v not in served]
    text = ", ".join(map(str, served))
    return text + (f"; not {', '.join(map(str, missing))}" if missing else "")


def count(passed: int, total: int) -> str:
    return f"{passed}/{total}" if total else "–"


def ours_vs_theirs(ours: int, theirs: int, total: int) -> str:
    mark = " ▼" if ours < theirs else " ▲" if ours > theirs else ""
    return count(ours, total) + mark


def percent(passed: int, total: int) -> str:
    return f"{100 * passed / total:.1f} %" if total else "–"


def cell(text: str, limit: int = 220) -> str:
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|").replace("<", "&lt;")


# ---- the document ---------------------------------------------------------------------------

class Report:
    def __init__(self, build: str, results_dir: str):
        self.suites = suites(build)
        self.ours = {s.key: load(os.path.join(results_dir, f"onnxtrain-{s.key}.json")) for s in self.suites}
        self.ort = {s.key: load(os.path.join(results_dir, f"ort-{s.key}.json")) for s in self.suites}
        self.ort_passed = {k: {t["id"] for t in r["tests"] if t["passed"]} for k, r in self.ort.items()}
        self.kernels = defaultdict(list)  # "ai.onnx.Add" -> rows
        for row in self.ours[self.suites[0].key]["kernels"]:
            self.kernels[row["op"]].append(row)
        self.schemas = schema_versions()
        self.ort_name = f"ONNX Runtime {onnxruntime.__version__}"

    def covered(self, op: str, version: int) -> bool:
        return any(r["since"] <= version <= r["until"] for r in self.kernels.get(op, []))

    def write(self, path: str) -> None:
        lines = self.header() + self.summary() + self.operators() + self.not_implemented() + self.failures()
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)

    def header(self) -> list:
        return [
            "# Operators and conformance",
            "",
            "Generated by `.venv/bin/python tests/conformance/report.py` (README, Development) from the",
            "kernel registry (`src/ops/registry.cpp`) and one run of onnxtrain (`onnxtrain-conformance`)",
            f"and of {self.ort_name} (CPU provider, `tests/conformance/ort_runner.py`) over the official",
            f"ONNX backend tests of two releases: ONNX {onnx.__version__}'s (node tests generated from the",
            "onnx wheel's cases, its light models and model folders) and ONNX 1.12's (Debian",
            "`libonnx-testdata`). Both runtimes are judged alike: outputs of the same shape and element",
            "type, floating-point values within |got − expected| ≤ 1e-7 + 1e-3·|expected| (ONNX's backend",
            "runner's defaults), NaN matching NaN, everything else exact. A test counts for every operator",
            "its model uses, and can fail because of another one.",
            "",
        ]

    def summary(self) -> list:
        lines = ["## Summary", "",
                 f"| suite | folder | tests | every op implemented | onnxtrain passes | {self.ort_name} passes |",
                 "|---|---|---:|---:|---:|---:|"]
        for suite in self.suites:
            tests = self.ours[suite.key]["tests"]
            for folder in suite.folders + ["all"]:
                group = [t for t in tests if folder in ("all", t["folder"])]
                ours = sum(t["passed"] for t in group)
                theirs = sum(t["id"] in self.ort_passed[suite.key] for t in group)
                implemented = sum(t["implemented"] for t in group)
                name = f"**{folder}**" if folder == "all" else folder
                lines.append(f"| {suite.title} | {name} | {len(group)} | {implemented} | "
                             f"{ours} ({percent(ours, len(group))}) | {theirs} ({percent(theirs, len(group))}) |")
        lines.append("")
        lines += self.goal()
        for suite in self.suites:
            tests = self.ours[suite.key]["tests"]
            ahead = sum(t["passed"] and t["id"] not in self.ort_passed[suite.key] for t in tests)
            behind = sum(not t["passed"] and t["id"] in self.ort_passed[suite.key] for t in tests)
            lines.append(f"- {suite.title}: onnxtrain passes {ahead} tests that {self.ort_name} fails, "
                         f"and fails {behind} that it passes.")
        lines += self.ort_refusals()
        lines.append("")
        return lines

    def goal(self) -> list:
        suite = self.suites[0]
        node = [t for t in self.ours[suite.key]["tests"] if t["folder"] == "node"
                and all(split_op(o["op"])[0] == "ai.onnx" for o in t["ops"])]
        ours = sum(t["passed"] for t in node)
        theirs = sum(t["id"] in self.ort_passed[suite.key] for t in node)
        needed = max(0, math.ceil(round(GOAL * len(node), 6)) - ours)
        verdict = "goal met" if needed == 0 else f"{needed} more to pass for the goal"
        return [f"**Goal: {GOAL * 100:.0f} % of {suite.title}'s ai.onnx node tests pass** (the node tests whose every "
                f"node is in the ai.onnx domain: {len(node)}). onnxtrain passes {ours} "
                f"({percent(ours, len(node))}; {verdict}); {self.ort_name} passes {theirs} "
                f"({percent(theirs, len(node))}).", ""]

    def ort_refusals(self) -> list:
        """How many of ONNX Runtime's failures are models it refuses to load, by cause."""
        lines = []
        for suite in self.suites:
            causes = defaultdict(int)
            for t in self.ort[suite.key]["tests"]:
                m = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", t["reason"])
                if m:
                    causes[f"the model's IR version is {m[1]}, it loads up to {m[2]}"] += 1
                elif "is not a registered function/op" in t["reason"] or "NOT_IMPLEMENTED" in t["reason"]:
                    causes["an operator it does not implement"] += 1
            if causes:
                text = "; ".join(f"{n} ({cause})" for cause, n in sorted(causes.items(), key=lambda c: -c[1]))
                lines.append(f"- {suite.title}: {self.ort_name} refuses to load or run: {text}.")
        return lines

    def per_op_counts(self, suite: Suite) -> dict:
        """"ai.onnx.Add" -> [tests, onnxtrain passed, ORT passed] over the tests using it."""
        counts = defaultdict(lambda: [0, 0, 0])
        for t in self.ours[suite.key]["tests"]:
            for op in {o["op"] for o in t["ops"]}:
                c = counts[op]
                c[0] += 1
                c[1] += t["passed"]
                c[2] += t["id"] in self.ort_passed[suite.key]
        return counts

    def operators(self) -> list:
        counts = {s.key: self.per_op_counts(s) for s in self.suites}
        lines = ["## Operators onnxtrain implements", "",
                 "One row per operator: the op versions (ONNX schema `since_version`s) its kernel rows serve and",
                 "those they do not (\"not\"), the element types of its main input (numeric: floats — float16,",
                 "float32, float64, bfloat16 — and int8–64, uint8–64), and per suite the tests whose model uses",
                 f"it that onnxtrain and {self.ort_name} pass. ▼: onnxtrain passes fewer of them than ONNX",
                 "Runtime; ▲: more.", ""]
        by_domain = defaultdict(list)
        for op in self.kernels:
            by_domain[split_op(op)[0]].append(op)
        for domain in sorted(by_domain, key=lambda d: (d != "ai.onnx", d)):
            ops = sorted(by_domain[domain], key=lambda o: split_op(o)[1])
            tested = any(op in counts[s.key] for s in self.suites for op in ops)
            head, rule = "| operator | versions | element types |", "|---|---|---|"
            for s in self.suites if tested else []:
                head += f" {s.title} onnxtrain | {s.title} ORT |"
                rule += "---:|---:|"
            lines += [f"### {domain}", ""]
            if not tested:
                lines += ["No backend test uses these (onnxtrain's own ops, emitted by gradient rules and graph",
                          "fusions).", ""]
            lines += [head, rule]
            for op in ops:
                rows = self.kernels[op]
                types = types_text(set().union(*(set(r["types"]) for r in rows)))
                notes = [r["note"] for r in rows if r.get("note")]
                line = (f"| {split_op(op)[1]} | {versions_text(rows, self.schemas.get(split_op(op), []))} | "
                        f"{'; '.join(notes) or types} |")
                for s in self.suites if tested else []:
                    total, ours, theirs = counts[s.key].get(op, [0, 0, 0])
                    line += f" {ours_vs_theirs(ours, theirs, total)} | {count(theirs, total)} |"
                lines.append(line)
            lines.append("")
        return lines

    def not_implemented(self) -> list:
        """Ops (and op versions) the tests use that no kernel row serves."""
        uses = defaultdict(lambda: {"versions": set()})  # op -> versions, per suite [tests, ORT passed]
        for s in self.suites:
            for t in self.ours[s.key]["tests"]:
                for o in t["ops"]:
                    if self.covered(o["op"], o["version"]):
                        continue
                    use = uses[o["op"]]
                    use["versions"].add(o["version"])
                    use.setdefault(s.key, set()).add(t["id"])
        head = "| operator | versions without a kernel |"
        rule = "|---|---|"
        for s in self.suites:
            head += f" {s.title} tests | {s.title} ORT passes |"
            rule += "---:|---:|"
        lines = ["## Used by the tests, not implemented", "",
                 "Operators, or versions of them, that a test's model uses and no kernel row serves (version 0:",
                 "ONNX has no schema for the op at the model's opset), most used first; the tests using one",
                 "fail in onnxtrain.", "", head, rule]

        def weight(item):
            return -sum(len(item[1].get(s.key, ())) for s in self.suites), item[0]

        for op, use in sorted(uses.items(), key=weight):
            name = op.removeprefix("ai.onnx.") if split_op(op)[0] == "ai.onnx" else op
            line = f"| {name} | {', '.join(map(str, sorted(use['versions'])))} |"
            for s in self.suites:
                ids = use.get(s.key, set())
                line += f" {len(ids) or '–'} | {count(len(ids & self.ort_passed[s.key]), len(ids))} |"
            lines.append(line)
        lines.append("")
        return lines

    def failures(self) -> list:
        suite = self.suites[0]
        reasons = known_failures(suite.manifest)
        failing = [t for t in self.ours[suite.key]["tests"] if not t["passed"]]
        lines = [f"## Failing tests of {suite.title}", "",
                 f"Reasons from `{os.path.relpath(suite.manifest, ROOT)}` (`# fails:` lines) where it gives one,",
                 f"else onnxtrain's message. ORT: whether {self.ort_name} passes the test.", ""]
        for title, group in (("Every operator implemented", [t for t in failing if t["implemented"]]),
                             ("Using an operator onnxtrain does not implement",
                              [t for t in failing if not t["implemented"]])):
            lines += [f"### {title} ({len(group)})", "", "| test | reason | ORT |", "|---|---|---|"]
            for t in group:
                ort = "pass" if t["id"] in self.ort_passed[suite.key] else "fail"
                reason = reasons.get(t["id"]) or re.sub(r"\S*/" + re.escape(t["id"]) + r"/(model\.onnx, )?", "",
                                                        t["reason"])
                lines.append(f"| `{t['id']}` | {cell(reason)} | {ort} |")
            lines.append("")
        return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build", "release"), help="the CMake build folder")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "ops.md"), help="the markdown to write")
    parser.add_argument("--reuse", action="store_true", help="write the report from the last run's results")
    parser.add_argument("--jobs", type=int, default=2, choices=(1, 2), help="runners at a time")
    args = parser.parse_args()
    results_dir = os.path.join(args.build, "conformance-results")
    start = time.monotonic()
    if not args.reuse:
        run_suites(args.build, results_dir, args.jobs)
    Report(args.build, results_dir).write(args.out)
    print(f"report: wrote {os.path.relpath(args.out)} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
