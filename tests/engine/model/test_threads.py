"""The CPU thread policy: one core fewer than usable, every core while the other processes are idle."""

from __future__ import annotations

import os

import torch

from dfim.engine import Engine
from dfim.engine.api import FillRequest
from dfim.engine.model.threads import AdaptiveThreads, busy_seconds


class FakeMachine:
    """A clock, the machine's busy CPU seconds and this process's own CPU seconds, advanced by hand."""

    def __init__(self) -> None:
        self.now, self.busy, self.own = 100.0, 5000.0, 10.0

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.now += seconds
        self.own += seconds * own_cores
        self.busy += seconds * (own_cores + other_cores)

    def policy(self, **kw) -> AdaptiveThreads:
        return AdaptiveThreads(
            base=1,
            wide=2,
            read_busy=lambda: self.busy,
            clock=lambda: self.now,
            own_cpu=lambda: self.own,
            **kw,
        )


def test_all_cores_only_while_the_others_are_idle():
    m = FakeMachine()
    policy = m.policy()
    m.run(2.0, own_cores=1.0, other_cores=0.05)  # we filled on one core, the editor barely ran
    assert policy.choose() == 2
    m.run(2.0, own_cores=2.0, other_cores=0.0)  # our own two threads are not "others"
    assert policy.choose() == 2
    m.run(2.0, own_cores=1.0, other_cores=0.9)  # a build started on the other core
    assert policy.choose() == 1
    assert abs(policy.others_cores - 0.9) < 1e-9
    m.run(3.0, own_cores=0.0, other_cores=0.1)  # it ended
    assert policy.choose() == 2


def test_a_look_needs_enough_time_and_keeps_the_last_verdict():
    m = FakeMachine()
    policy = m.policy(min_interval=0.5)
    m.run(0.1, own_cores=0.0, other_cores=0.0)
    assert policy.choose() == 1  # too soon after loading to know: the safe count
    m.run(1.0, own_cores=0.0, other_cores=2.0)
    assert policy.choose() == 1
    m.run(0.2, own_cores=0.0, other_cores=0.0)  # too short to judge: still busy
    assert policy.choose() == 1
    m.run(1.0, own_cores=0.0, other_cores=0.0)  # measured over the 1.2 s since the last look
    assert policy.choose() == 2


def test_without_proc_stat_the_base_count():
    policy = AdaptiveThreads(base=1, wide=4, read_busy=lambda: None)
    assert policy.choose() == 1 and policy.choose() == 1


def test_busy_seconds_reads_proc_stat_format(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (ticks of 1/CLK_TCK s)
    stat.write_text("cpu  300 0 100 5000 50 0 0 0 0 0\ncpu0 150 0 50 2500 25 0 0 0 0 0\n", encoding="ascii")
    assert busy_seconds(str(stat)) == 400 / os.sysconf("SC_CLK_TCK")
    assert busy_seconds(str(tmp_path / "missing")) is None
    (tmp_path / "odd").write_text("intr 1 2 3\n", encoding="ascii")
    assert busy_seconds(str(tmp_path / "odd")) is None


def test_applied_restores_the_count_and_a_fill_reports_it():
    before = torch.get_num_threads()
    policy = AdaptiveThreads(base=before, wide=before + 1, read_busy=lambda: 0.0, min_interval=0.0)
    policy.quiet = True  # as after a quiet look; the fake machine reports no CPU used by anyone
    with policy.applied() as threads:
        assert threads == before + 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before

    engine = Engine.load(threads=1)  # a fixed count: no adaptive policy
    assert engine.threads is None
    result = engine.fill(FillRequest("def add(a, b):\n    return ", "\n", max_tokens=8, seed=0))
    assert result.threads == 1
