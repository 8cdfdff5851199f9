"""The embedded study is pre-registered: its candidate designs and rule were committed before the
pilot's results, the design `make sweep` runs is what the rule picks from the pilot's recorded
evidence, and its confirmatory seeds are not the pilot's."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("lookup_study", ROOT / "scripts" / "lookup_study.py")
study = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(study)
PRE = yaml.safe_load(study.PREREGISTRATION.read_text())


def first_commit(path: Path) -> int:
    """The commit time of the commit that added `path` (git's own record, not the file's mtime)."""
    out = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%ct", "--", str(path.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[-1])


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_preregistration_was_committed_before_the_pilots_design():
    assert first_commit(study.PREREGISTRATION) < first_commit(study.DESIGN)


def test_the_design_is_the_rules_choice_from_the_recorded_pilot():
    design = json.loads(study.DESIGN.read_text())
    rule = PRE["rule"]
    for judged in design["candidates"]:
        pre = PRE["candidates"][judged["candidate"]]
        assert {k: judged[k] for k in pre} == pre  # the candidate as registered
        means = pd.DataFrame(judged["pilot_means"]).T.astype(float)
        means.index = means.index.astype(int)
        assert study.window(means, rule["level_off"]) == judged["window"]
        assert judged["eligible"] == (not judged["why_not"])
        assert 3 <= judged["seeds"] <= rule["max_seeds"]
    chosen = study.choose(design["candidates"], rule["tie"])
    assert design["chosen"] == chosen["candidate"] and design["budgets"] == chosen["window"]
    assert design["seeds"] == list(range(PRE["confirm_first_seed"], PRE["confirm_first_seed"] + chosen["seeds"]))
    assert not set(design["seeds"]) & set(PRE["pilot_seeds"])


def test_the_window_ends_before_the_best_cell_levels_off_and_the_choice_prefers_power_then_time():
    means = pd.DataFrame({2: [0.30, 0.50, 0.60, 0.605], 4: [0.35, 0.55, 0.70, 0.72]}, index=[512, 1024, 2048, 4096])
    assert study.window(means, 0.01) == [512, 1024, 2048, 4096]  # n = 4 still gains 0.02 at 4,096
    assert study.window(means, 0.03) == [512, 1024, 2048]
    assert study.window(means, 0.5) == [512]
    a = {"candidate": "a", "eligible": True, "power": 0.80, "minutes": 11.0}
    b = {"candidate": "b", "eligible": True, "power": 0.78, "minutes": 6.0}
    c = {"candidate": "c", "eligible": False, "power": 0.99, "minutes": 1.0}
    assert study.choose([a, b, c], 0.05)["candidate"] == "b"  # within the tie: fewer minutes
    assert study.choose([a, b, c], 0.01)["candidate"] == "a"
    assert study.choose([{**a, "eligible": False}, {**b, "eligible": False}], 0.01)["candidate"] == "a"
