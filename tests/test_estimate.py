"""estimate: slot-seconds per stage and arm from the calibration table and the config, and
the budget guard that names the estimate, the budget and what drives the cost."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import small_config

from pairflow.budget.calibrate import FORMAT
from pairflow.budget.estimate import check_budget, estimate, estimate_or_refuse, summary_lines, write_estimate
from pairflow.errors import BudgetError
from pairflow.plan.config import study_from_raw


def _study(tmp: Path, **over: object):
    cfg = small_config(tmp, tmp / "model", **over)
    return study_from_raw(copy.deepcopy(cfg), tmp, source="test")


def _phase(s: float) -> dict:
    return {"s": s, "peak_rss_mb": 1000.0, "peak_device_mb": None}


TABLE = {"key": "xxh3_128:00", "device": "cpu", "import": _phase(10.0),
         "arms": {"control": {"generate_s": 4.0, "score_s": 1.0,
                              "phases": {"load": _phase(2.0), "encode": _phase(0.5)}},
                  "pab": {"generate_s": 2.0, "score_s": 1.0, "phases": {"load": _phase(0.0), "encode": _phase(0.5)}}}}


def test_slot_seconds_per_stage_and_arm(tmp_path):
    study = _study(tmp_path, timing={"warmup": 1, "repeats": 3})  # 2 prompts x 1 seed, control + pab
    est = estimate(study, TABLE)
    assert est["slot_s"]["generate"] == {"control": 8.0, "pab": 4.0}
    assert est["slot_s"]["score"] == {"control": 2.0, "pab": 2.0}
    # timing: (1 warm-up + 3 repeats x 2 pairs) runs of the generation without its encode
    assert est["slot_s"]["timing"] == {"control": 7 * 3.5, "pab": 7 * 1.5}
    # warm-up: one combined job x 1 CPU worker x (import 10 + loads 2), split by work (10 : 6)
    assert sum(est["slot_s"]["warm-up"].values()) == pytest.approx(12.0)
    assert est["slot_s"]["warm-up"]["control"] == pytest.approx(12.0 * 10 / 16)
    assert est["total_slot_s"] == pytest.approx(12 + 4 + 35 + 12) and est["gpu_hours"] == est["total_slot_s"] / 3600
    assert est["wall_s"] == pytest.approx(12 + 16 + 35 + 12)
    two = estimate(study, TABLE, nodes=2, slots_per_node=2)  # 4 slots: 4 warm-ups, a quarter of the wall
    assert sum(two["slot_s"]["warm-up"].values()) == pytest.approx(48.0) and two["fanout_wall_s"] == 12 + 4
    assert "total" in "\n".join(summary_lines(est, None))


def test_a_sampled_timing_pass_costs_less(tmp_path):
    full = estimate(_study(tmp_path, timing={"pairs": "all"}), TABLE)["stage_slot_s"]["timing"]
    one = estimate(_study(tmp_path, timing={"pairs": 1}), TABLE)["stage_slot_s"]["timing"]
    assert one < full
    # sequential (auto): at most timing.max_prompts prompts, every seed of each
    assert estimate(_study(tmp_path), TABLE)["stage_slot_s"]["timing"] == full
    assert estimate(_study(tmp_path, timing={"max_prompts": 3, "pilot_prompts": 3}),
                    TABLE)["stage_slot_s"]["timing"] == full  # 2 prompts: the ceiling does not bind


def test_the_budget_guard_names_estimate_budget_and_drivers(tmp_path):
    study = _study(tmp_path, fleet={"cpu_workers": 1, "retries": 1, "budget_gpu_hours": 0.01},
                   timing={"repeats": 3, "pairs": "all"})
    est = estimate(study, TABLE)
    with pytest.raises(BudgetError) as e:
        check_budget(study, est, "config/x.yaml")
    text = str(e.value)
    for part in ("0.018 CPU-worker-hours", "budget_gpu_hours = 0.01", "config/x.yaml", "2 prompts", "seeds",
                 "arms ['control', 'pab']", "timing.repeats 3", "timing.pairs all", "largest stage is timing"):
        assert part in text
    check_budget(_study(tmp_path, fleet={"cpu_workers": 1, "retries": 1, "budget_gpu_hours": 1.0}), est)
    check_budget(_study(tmp_path), est)  # no budget, no guard


def test_the_written_estimate_does_not_change_with_the_budget(tmp_path):
    """Rule estimate's output is the same bytes under any passing budget (the budget is no
    rerun trigger of it, so a budget added to a finished study replans nothing; planning
    checks the budget whenever the table exists); over the budget it refuses and writes
    nothing."""
    table = tmp_path / "table.json"
    table.write_text(json.dumps({**TABLE, "kind": "calibration", "format": FORMAT}))
    written = []
    for budget in (None, 1.0, 100.0):
        fleet = {"cpu_workers": 1, "retries": 1, **({"budget_gpu_hours": budget} if budget else {})}
        out = tmp_path / f"estimate-{budget}.json"
        write_estimate(_study(tmp_path, fleet=fleet), table, out)
        written.append(out.read_bytes())
    assert written[0] == written[1] == written[2] and "budget" not in json.loads(written[0])
    over = tmp_path / "over.json"
    poor = _study(tmp_path, fleet={"cpu_workers": 1, "retries": 1, "budget_gpu_hours": 1e-6})
    with pytest.raises(BudgetError, match="over fleet/budget_gpu_hours = 1e-06"):
        write_estimate(poor, table, over)
    assert not over.exists()


def test_rule_estimate_refuses_with_exit_3_and_one_logged_line(tmp_path, caplog):
    """A refusal is no crash: rule estimate's step logs it once and returns exit status 3
    (its adapter exits with it; no traceback), and writes no estimate."""
    table = tmp_path / "table.json"
    table.write_text(json.dumps({**TABLE, "kind": "calibration", "format": FORMAT}))
    poor = _study(tmp_path, fleet={"cpu_workers": 1, "retries": 1, "budget_gpu_hours": 1e-6})
    with caplog.at_level("ERROR", logger="pairflow.budget.estimate"):
        assert estimate_or_refuse(poor, table, tmp_path / "over.json", "config/x.yaml") == 3
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith("refused: study 'test' is estimated at") and "config/x.yaml" in line
    assert not (tmp_path / "over.json").exists()
    rich = _study(tmp_path, fleet={"cpu_workers": 1, "retries": 1, "budget_gpu_hours": 1.0})
    assert estimate_or_refuse(rich, table, tmp_path / "ok.json") == 0 and (tmp_path / "ok.json").is_file()
