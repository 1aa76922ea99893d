"""Tests for utils/stage_upstream.py on a fake `transformers` package (no torch): the verdict of each table row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
STAGER = REPO_ROOT / "utils" / "stage_upstream.py"

PATCH = """\
diff --git a/src/transformers/__init__.py b/src/transformers/__init__.py
--- a/src/transformers/__init__.py
+++ b/src/transformers/__init__.py
@@ -1 +1 @@
-VALUE = {old}
+VALUE = {new}
"""
TEST = """\
import transformers


def test_value():
    assert {condition}
"""


def write_pr(root: Path, name: str, patch_old: int, condition: str) -> None:
    """A staged PR whose patch turns `VALUE = patch_old` into `VALUE = 2` and whose test asserts `condition`."""
    pr = root / name
    pr.mkdir(parents=True)
    (pr / "PR.md").write_text(f"# {name}\n")
    (pr / "fix.patch").write_text(PATCH.format(old=patch_old, new=2))
    (pr / "test_value.py").write_text(TEST.format(condition=condition))


def test_rows_report_each_way_a_staged_pr_goes_stale(tmp_path: Path) -> None:
    package = tmp_path / "site-packages" / "transformers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")  # the "pinned" version
    root = tmp_path / "upstream"
    write_pr(root, "good", 1, "transformers.VALUE == 2")  # fails before, applies, passes after
    write_pr(root, "stale-patch", 3, "transformers.VALUE == 2")  # the lines it patches have changed
    write_pr(root, "fixed-upstream", 1, "transformers.VALUE > 0")  # the test passes before the patch
    (root / "no-test").mkdir()
    (root / "no-test" / "PR.md").write_text("# no-test\n")

    result = subprocess.run(
        [sys.executable, str(STAGER), "--root", str(root), "--package", str(package), "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = {line.split(" | ")[0].strip("| "): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert result.returncode == 1, result.stdout + result.stderr
    expected = {"good": ("yes | yes | yes", "ok"), "stale-patch": ("no | yes | -", "WRONG")}
    expected["fixed-upstream"] = ("yes | no | yes", "WRONG")
    for name, (cells, verdict) in expected.items():
        assert rows[name].startswith(f"| {name} | {cells} |") and rows[name].endswith(f"| {verdict} |"), rows[name]
    assert "--- no-test: missing fix.patch, test_*.py" in result.stdout
    assert "1/4 staged PRs fail before and pass after" in result.stdout
