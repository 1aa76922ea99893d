"""Repo-wide consistency checks for transformers_static (stdlib only, never imports the library).

Usage:
    python utils/check_masks.py [--root DIR]        check; exit 1 on any problem, 0 with a one-line "ok" otherwise
    python utils/check_masks.py --fix [--root DIR]  rewrite drifted copies from their sources, then check

Rules (each in its module of utils/repo_checks/):
  copies               (copies.py) `# Copied from transformers_static.<module>.<Name>[.<method>] [with A->B, C->D]`, on the line
                       directly above a `class`/`def` (above its decorators), means the definition (from its
                       `class`/`def` line to its end, decorators excluded) equals the source after the renames.
                       Each rename `A->B` also renames `a->b` and `A->B` upper-cased (like upstream `all-casing`);
                       renames apply in order. Leading indentation, trailing whitespace and blank lines are ignored.
                       A line with `# Ignore copy` exempts the statement it starts (trailing comment) or the
                       statement below it (own-line comment), with its body, and the matching source statement
                       (defs/classes matched by name, other statements by aligning their siblings).
                       A nested definition with its own marker is checked against its own source only.
  modular              (modular.py) each models/<arch>/modular_<arch>.py (a model's differences from one parent model)
                       expands to its modeling_<arch>.py (and configuration_<arch>.py): those files must equal
                       the expansion; `--fix` rewrites them. The module's docstring says how a file expands.
  attention-signature  (mask_contract.py) `*Attention` classes defining `forward` take `attention_mask` and `cache_position`; the
                       latter may be waived by `# check_masks: no-cache-position: <reason>` in the class.
  markers              every `# check_masks:` comment is `no-cache-position: <non-empty reason>`.
  no-mask-in-models    models/*/modeling_*.py never build masks (tril/triu, finfo(...).min, masked_fill on a
                       mask, private AttentionMaskConverter attributes).
  registration, tests  (registration.py) every models/<arch>/ is a key of CONFIG_MAPPING_NAMES and MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
                       and has tests/models/<arch>/test_modeling_<arch>.py defining a class derived (directly or
                       through a class of that file) from CausalLMParityTests, the upstream parity suite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the rules' package beside this script

from repo_checks.common import PKG, Loader, Problem  # noqa: E402
from repo_checks.copies import apply_renames, check_copies, fix_copies, parse_renames  # noqa: E402
from repo_checks.mask_contract import check_models  # noqa: E402
from repo_checks.modular import check_modular, fix_modular  # noqa: E402
from repo_checks.registration import architectures, check_registration  # noqa: E402

__all__ = ["apply_renames", "main", "parse_renames", "run_checks"]


def run_checks(root: Path) -> tuple[list[Problem], str]:
    """All problems (sorted, deduplicated) and a summary of what was checked."""
    loader = Loader(root)
    problems, copies = check_copies(root, loader)
    modular_problems, modular = check_modular(root)
    problems += modular_problems
    model_problems, models = check_models(root, loader)
    archs = architectures(root) if (root / "src" / PKG / "models").is_dir() else []
    problems += model_problems + list(check_registration(root, loader, archs))
    summary = f"{copies} copies, {modular} modular files, {models} model files, {len(archs)} architectures"
    return sorted(set(problems) | loader.problems), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check copies, the mask contract and model registration.")
    parser.add_argument("--fix", action="store_true", help="rewrite drifted copies from their sources, then check")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="repository root")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "src" / PKG).is_dir():
        print(f"check_masks: {root} has no src/{PKG}")
        return 1
    if args.fix:
        for line in fix_modular(root) + fix_copies(root):
            print(f"fixed {line}")
    problems, summary = run_checks(root)
    for problem in problems:
        print(problem.render())
    if problems:
        print(f"check_masks: {len(problems)} problem(s) ({summary})")
        return 1
    print(f"check_masks: ok ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
