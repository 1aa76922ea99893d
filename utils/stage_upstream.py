"""Prove the staged upstream pull requests against the pinned upstream (`make stage`; stdlib only).

Each `upstream/<name>/` holds `PR.md`, `fix.patch` (a diff against upstream's `src/transformers/...`) and
`test_*.py`. For each one, on its own copy of the installed `transformers` package, laid out as `src/transformers/`
in a temporary directory:

    1. run its tests there: they must FAIL (the defect is present in the pinned version);
    2. `git apply --check`, then `git apply` the patch: it must apply cleanly;
    3. run its tests again: they must PASS.

One table row per PR (applies / fails before / passes after); exit status 1 when any row is wrong. A patch that no
longer applies, or a test that passes before the patch (upstream fixed it), is how a change of the pinned version
shows up.

Usage:
    python utils/stage_upstream.py [NAME ...] [--jobs N] [--timeout SECONDS] [--package DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCH_PATH = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# Written next to the copied tests: the run fails at collection unless `transformers` is the copy under test.
CONFTEST = """import pathlib

import transformers

COPY = pathlib.Path(__file__).parent / "src" / "transformers"
assert pathlib.Path(transformers.__file__).parent.resolve() == COPY.resolve(), transformers.__file__
"""


@dataclass
class Run:
    """One pytest run: its exit status (None on timeout), seconds and the tail of its output."""

    returncode: int | None
    seconds: float
    tail: str

    @property
    def failed(self) -> bool:
        return self.returncode == 1  # pytest: 1 = tests ran and some failed; 2-5 = errors, 0 = all passed

    @property
    def passed(self) -> bool:
        return self.returncode == 0


@dataclass
class Row:
    name: str
    applies: bool | None = None
    before: Run | None = None
    after: Run | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return bool(not self.problem and self.applies and self.before.failed and self.after.passed)

    def cells(self) -> list[str]:
        seconds = sum(run.seconds for run in (self.before, self.after) if run)
        return [
            self.name,
            yes_no(self.applies),
            describe(self.before, self.before.failed if self.before else None),
            describe(self.after, self.after.passed if self.after else None),
            f"{seconds:.0f}",
            "ok" if self.ok else "WRONG",
        ]


def yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def describe(run: Run | None, expected: bool | None) -> str:
    """`yes`/`no` for the expected outcome; a timeout or a pytest error (collection, usage) says so."""
    if run is None:
        return "-"
    if run.returncode is None:
        return "no (timeout)"
    if run.returncode not in (0, 1):
        return f"no (pytest exit {run.returncode})"
    return yes_no(expected)


def installed_package() -> Path:
    """The installed `transformers` package directory, found without importing it."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("transformers is not installed in this environment (make install)")
    return Path(next(iter(spec.submodule_search_locations)))


def check_layout(pr: Path) -> str:
    """A problem with the PR's files, or ''."""
    patch, tests = pr / "fix.patch", sorted(pr.glob("test_*.py"))
    missing = [path.name for path in (pr / "PR.md", patch) if not path.is_file()] + ([] if tests else ["test_*.py"])
    if missing:
        return f"missing {', '.join(missing)}"
    paths = [path for pair in PATCH_PATH.findall(patch.read_text()) for path in pair]
    if not paths or any(not path.startswith("src/transformers/") for path in paths):
        return "fix.patch must be a git diff of files under src/transformers/ only"
    if any("transformers_static" in path.read_text() for path in [patch, *tests]):
        return "imports this project"
    return ""


def run_tests(workdir: Path, tests: list[str], timeout: float, threads: int) -> Run:
    """pytest on `tests` inside `workdir`, importing `workdir/src/transformers`, with `threads` OpenMP threads
    unless set; the whole process group is killed on timeout (spawned workers included)."""
    env = {"OMP_NUM_THREADS": str(threads), **os.environ, "PYTHONPATH": str(workdir / "src")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(workdir), *tests]
    start = time.monotonic()
    with subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
            returncode = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            returncode = None
    return Run(returncode, time.monotonic() - start, "\n".join(output.splitlines()[-25:]))


def git_apply(workdir: Path, patch: Path, check: bool) -> subprocess.CompletedProcess:
    command = ["git", "apply", *(["--check"] if check else []), str(patch)]
    return subprocess.run(command, cwd=workdir, capture_output=True, text=True)


def stage(pr: Path, package: Path, timeout: float, threads: int) -> Row:
    """Copy the package, test (must fail), apply the patch (must apply), test again (must pass)."""
    row = Row(pr.name, problem=check_layout(pr))
    if row.problem:
        return row
    with tempfile.TemporaryDirectory(prefix=f"stage-{pr.name}-") as tmp:
        workdir = Path(tmp)
        shutil.copytree(package, workdir / "src" / "transformers", ignore=shutil.ignore_patterns("__pycache__"))
        # A repository of its own, so that `git apply` is rooted here wherever the temporary directory is
        subprocess.run(["git", "init", "-q"], cwd=workdir, check=True)
        (workdir / "conftest.py").write_text(CONFTEST)
        tests = [shutil.copy(test, workdir) for test in sorted(pr.glob("test_*.py"))]
        row.before = run_tests(workdir, tests, timeout, threads)
        for check in (True, False):
            applied = git_apply(workdir, pr / "fix.patch", check)
            if applied.returncode:
                row.applies, row.problem = False, (applied.stderr or applied.stdout).strip()
                return row
        row.applies = True
        row.after = run_tests(workdir, tests, timeout, threads)
    return row


def table(rows: list[Row]) -> str:
    header = ["PR", "applies", "fails before", "passes after", "s", "verdict"]
    lines = [header, ["---"] * len(header), *(row.cells() for row in rows)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def explain(row: Row) -> str:
    """What went wrong with a row, with the relevant pytest output."""
    parts = [f"--- {row.name}: {row.problem}" if row.problem else f"--- {row.name}"]
    if row.before and not row.before.failed:
        parts.append(
            f"before the patch (expected a test failure, got exit {row.before.returncode}):\n{row.before.tail}"
        )
    if row.after and not row.after.passed:
        parts.append(f"after the patch (expected a pass, got exit {row.after.returncode}):\n{row.after.tail}")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="PR directories under upstream/ (default: all)")
    parser.add_argument("--root", type=Path, default=ROOT / "upstream", help="the folder of staged PRs")
    parser.add_argument("--package", type=Path, default=None, help="the transformers package (default: installed)")
    parser.add_argument("--jobs", type=int, default=2, help="PRs staged at once")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per test run")
    args = parser.parse_args(argv)
    prs = sorted(
        path
        for path in args.root.iterdir()
        if path.is_dir() and path.name[0] not in "._" and (not args.names or path.name in args.names)
    )
    if not prs or (args.names and len(prs) != len(set(args.names))):
        raise SystemExit(
            f"no staged PR named {args.names} under {args.root}" if args.names else f"no PR in {args.root}"
        )
    package = args.package or installed_package()
    start = time.monotonic()
    jobs = max(args.jobs, 1)
    threads = max((os.cpu_count() or 1) // jobs, 1)  # the PRs staged at once share the cores
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(lambda pr: stage(pr, package, args.timeout, threads), prs))
    print(table(rows))
    for row in rows:
        if not row.ok:
            print(explain(row))
    wrong = sum(not row.ok for row in rows)
    print(f"{len(rows) - wrong}/{len(rows)} staged PRs fail before and pass after ({time.monotonic() - start:.0f} s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
