"""The shipped Prometheus files: `promtool check` accepts the config and rules, and
`promtool test rules` runs deploy/alerts_test.yml (each alert fires when it should, not before)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.ops_tools import require_tool
from tests.orchestrator_helpers import ROOT

pytestmark = pytest.mark.timeout(120)
DEPLOY = ROOT / "deploy"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), *args], cwd=DEPLOY, capture_output=True, text=True, timeout=90)


def test_rules_and_config_are_valid() -> None:
    rules = promtool("check", "rules", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS" in rules.stdout
    names = {r.get("alert") for g in yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"] for r in g["rules"]}
    assert {"MeshNoLeader", "MeshQuorumBelowMajority", "MeshCriticalDaemonGaveUp", "MeshNoPromotion",
            "MeshSelfplayStalled", "MeshNodeDown", "MeshQuorumLost"} <= names
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_alert_rules_fire_as_specified() -> None:
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_rule_test() -> None:
    """A rule no test evaluates can be wrong unnoticed: each alert appears in alerts_test.yml,
    at least once expected to fire."""
    alerts = {r["alert"] for g in yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((DEPLOY / "alerts_test.yml").read_text())["tests"]
    firing = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts == firing, alerts ^ firing


def test_promtool_test_catches_a_wrong_expectation(tmp_path) -> None:
    """The rule tests can fail: an alert expected too early is reported."""
    broken = (DEPLOY / "alerts_test.yml").read_text().replace("eval_time: 75s", "eval_time: 30s", 1)
    (tmp_path / "alerts.yml").write_text((DEPLOY / "alerts.yml").read_text())
    (tmp_path / "alerts_test.yml").write_text(broken)
    result = subprocess.run([require_tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=90)
    assert result.returncode != 0 and "MeshNoLeader" in result.stdout + result.stderr
