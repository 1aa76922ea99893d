"""docs/MODELS.md is utils/models_table.py's output, and its classification covers upstream and us exactly."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "utils" / "models_table.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("models_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


models_table = _load()
UPSTREAM = models_table.upstream_mapping()
OURS = models_table.our_mapping()
ROW = re.compile(r"^\| `(?P<type>[^`]+)` \| `(?P<cls>[^`]+)` \| (?P<kind>[^|]+) \| (?P<status>[^|]+) \|$")


def _committed_rows() -> dict[str, tuple[str, str, str]]:
    rows = {}
    for line in models_table.OUTPUT.read_text().splitlines():
        if match := ROW.match(line):
            rows[match["type"]] = (match["cls"], match["kind"], match["status"])
    return rows


def test_classification_has_no_problems() -> None:
    assert models_table.classification_problems(UPSTREAM, OURS) == []


def test_committed_table_is_generated_text() -> None:
    expected = models_table.render(UPSTREAM, OURS, models_table.upstream_version())
    assert models_table.OUTPUT.read_text() == expected, "docs/MODELS.md is stale: run `make models-table`"


def test_every_upstream_type_has_one_row() -> None:
    rows = _committed_rows()
    assert sorted(rows) == sorted(UPSTREAM)
    assert all(rows[t][0] == UPSTREAM[t] for t in UPSTREAM)


def test_supported_rows_are_exactly_our_mapping() -> None:
    rows = _committed_rows()
    supported = {t for t, (_, _, status) in rows.items() if status.startswith("supported")}
    assert supported == set(OURS)
    for t in supported:
        status = rows[t][2]
        assert f"`{OURS[t]}`" in status
        tests_dir = models_table.tests_dir_of(t)
        assert tests_dir in status and (REPO_ROOT / tests_dir).is_dir(), f"{t}: {tests_dir} is missing"


def test_unsupported_rows_name_their_issue_or_reason() -> None:
    for t, (_, _, status) in _committed_rows().items():
        if t in OURS:
            continue
        if t in models_table.NOT_DECODER_ONLY:
            assert status.startswith("not decoder-only: ")
        elif t in models_table.refused_types():
            assert status.startswith("refused: ")
        else:
            assert status == f"not yet (issue {models_table.DECODER_ONLY[t][1]})"


def test_a_type_upstream_adds_is_reported_missing() -> None:
    upstream = {**UPSTREAM, "brand_new": "BrandNewForCausalLM"}
    problems = models_table.classification_problems(upstream, OURS)
    assert len(problems) == 1 and "'brand_new'" in problems[0] and "missing" in problems[0]


def test_a_supported_type_outside_upstream_is_reported() -> None:
    problems = models_table.classification_problems(UPSTREAM, {**OURS, "made_up": "MadeUpForCausalLM"})
    assert problems == ["our type 'made_up' is not in upstream's mapping"]


def test_check_fails_on_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "MODELS.md"
    stale.write_text(models_table.OUTPUT.read_text().replace("not yet (issue 41)", "supported", 1))
    assert models_table.main(["--check", "--output", str(stale)]) == 1
    assert "stale" in capsys.readouterr().out
    assert models_table.main(["--output", str(stale)]) == 0
    assert models_table.main(["--check", "--output", str(stale)]) == 0


def test_a_checkpoint_of_a_refused_type_gets_the_reason(tmp_path: Path) -> None:
    """Upstream's own config.json of a refused type: the error says why, not only that the type is unknown."""
    transformers.CpmAntConfig().save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "cpmant"
    for load in (AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match=r"model_type 'cpmant' is not supported: a prefix LM"):
            load(tmp_path)
