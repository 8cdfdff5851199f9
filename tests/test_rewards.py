import pytest
from omegaconf import OmegaConf

from isoflop_cli import config
from isoflop_cli.grid import expand
from isoflop_cli.recipe.rewards import make_reward
from isoflop_cli.tasks.arith import ArithTask

TASK = ArithTask()
P = TASK.problem([47, 38], ["+"])  # 85, answered reversed: "58"
CASES = {  # completion: (sparse, structured, dense)
    "58": (1.0, 1.0, 1.0),
    " 58 ": (1.0, 1.0, 1.0),
    "57": (0.0, 0.2, 0.5),
    "85": (0.0, 0.2, 0.0),
    "581": (0.0, 0.2, 2 / 3),
    "5": (0.0, 0.2, 0.5),
    "5+8": (0.0, 0.0, 1 / 3),
    "=": (0.0, 0.0, 0.0),
}


@pytest.mark.parametrize("name,column", [("sparse", 0), ("structured", 1), ("dense", 2)])
def test_rewards_on_hand_made_completions(name, column):
    reward = make_reward(OmegaConf.create({"name": name, "format_weight": 0.2}), TASK)
    for completion, expected in CASES.items():
        assert reward(P, completion) == pytest.approx(expected[column]), completion


def test_reward_is_a_grid_axis_and_model_family_too():
    overrides = ["grid.n=[4]", "grid.B_p=[4]", "+grid.axes={reward:[sparse,structured,dense],model:[tiny-arith-s,tiny-arith-l]}"]
    cfg = config.load(None, overrides)
    cells = expand(cfg, recompose=lambda extra: config.load(None, overrides + extra))
    assert len(cells) == 6 and len({c.run_id for c in cells}) == 6
    assert {(c.cfg.reward.name, c.cfg.model.name) for c in cells} == {
        (r, m) for r in ("sparse", "structured", "dense") for m in ("tiny-arith-s", "tiny-arith-l")}
    sizes = {c.cfg.model.name: c.cfg.model.build.hidden_size for c in cells}
    assert sizes == {"tiny-arith-s": 64, "tiny-arith-l": 256}
