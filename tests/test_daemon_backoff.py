"""Pure decisions of the daemon stack: backoff, crash loops, readiness, dependency order."""

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.coordination.daemons.backoff import is_crash_loop, restart_delay, should_reset_backoff
from app.coordination.daemons.manager import decide_readiness
from app.coordination.daemons.daemon_registry import DependencyCycleError, topo_order

bases = st.floats(min_value=0.001, max_value=10.0)
caps = st.floats(min_value=0.001, max_value=600.0)


@given(attempt=st.integers(0, 10_000), base=bases, cap=caps, seed=st.integers(0, 2**32))
def test_delay_is_positive_and_never_exceeds_the_cap(attempt, base, cap, seed):
    delay = restart_delay(attempt, base, cap, random.Random(seed))
    assert 0 < delay <= cap
    assert delay >= min(cap, base * 2.0 ** min(attempt, 62)) / 2


@given(attempt=st.integers(0, 60), base=bases, seed=st.integers(0, 2**32))
def test_uncapped_delays_never_shrink_whatever_the_jitter(attempt, base, seed):
    cap = base * 2.0 ** (attempt + 1)  # both attempt and attempt+1 stay uncapped
    rng = random.Random(seed)
    assert restart_delay(attempt, base, cap, rng) <= restart_delay(attempt + 1, base, cap, rng)


@given(attempt=st.integers(0, 100), base=bases, cap=caps)
def test_without_jitter_delay_is_the_capped_exponential(attempt, base, cap):
    assert restart_delay(attempt, base, cap) == min(cap, base * 2.0 ** min(attempt, 62))


def test_default_policy_is_one_second_doubling_to_five_minutes():
    assert [restart_delay(a) for a in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert restart_delay(20) == 300.0


@pytest.mark.parametrize(("bad", "why"), [(dict(attempt=-1), "attempt must be >= 0, got -1"),
                                          (dict(attempt=0, base=0), "base and cap must be > 0, got base=0 "),
                                          (dict(attempt=0, cap=-1), "base and cap must be > 0, got base=1.0 cap=-1")])
def test_delay_rejects_nonsense(bad, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        restart_delay(**bad)


@given(
    times=st.lists(st.floats(min_value=0, max_value=1000), max_size=30),
    now=st.floats(min_value=0, max_value=1000),
    limit=st.integers(1, 10),
    window=st.floats(min_value=0.1, max_value=500),
)
def test_crash_loop_counts_starts_inside_the_window(times, now, limit, window):
    inside = [t for t in times if now - window < t <= now]
    assert is_crash_loop(times, now, limit, window) == (len(inside) >= limit)
    # Starts outside the window never matter.
    assert is_crash_loop(inside, now, limit, window) == is_crash_loop(times, now, limit, window)


def test_five_starts_in_a_minute_is_a_crash_loop_but_spread_out_is_not():
    assert is_crash_loop([0, 10, 20, 30, 40], now=50)
    assert not is_crash_loop([0, 10, 20, 30, 40], now=61)  # the start at 0 left the window
    assert not is_crash_loop([10, 20, 30, 40], now=50)


@given(healthy_for=st.floats(0, 10_000), reset_after=st.floats(0.1, 10_000))
def test_backoff_resets_only_after_a_long_enough_healthy_run(healthy_for, reset_after):
    assert should_reset_backoff(healthy_for, reset_after) == (healthy_for >= reset_after)


@given(started=st.booleans(), draining=st.booleans(), gave_up=st.lists(st.sampled_from("abc"), max_size=3))
def test_ready_exactly_when_started_not_draining_and_no_critical_gave_up(started, draining, gave_up):
    r = decide_readiness(started=started, draining=draining, gave_up_critical=gave_up)
    assert r.ready == (started and not draining and not gave_up)
    if draining:
        assert r.reason == "draining"
    elif gave_up:
        assert all(name in r.reason for name in gave_up)
    elif not started:
        assert r.reason == "starting"


@st.composite
def dags(draw):
    n = draw(st.integers(0, 12))
    names = [f"d{i}" for i in range(n)]
    # Edges only from later to earlier names: acyclic by construction. Then shuffle key order.
    deps = {names[i]: draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else [] for i in range(n)}
    keys = draw(st.permutations(names))
    return {k: deps[k] for k in keys}


@given(dags())
@settings(max_examples=200)
def test_topo_order_puts_every_dependency_first(deps):
    order = topo_order(deps)
    assert sorted(order) == sorted(deps)
    position = {name: i for i, name in enumerate(order)}
    assert all(position[d] < position[n] for n, ds in deps.items() for d in ds)


@given(dags(), st.data())
@settings(max_examples=200)
def test_a_back_edge_is_always_reported_as_a_cycle(deps, data):
    edges = [(n, d) for n, ds in deps.items() for d in ds]
    if not edges:
        deps = {"a": ["a"]}
    else:
        node, dep = data.draw(st.sampled_from(edges))
        deps = {**deps, dep: [*deps[dep], node]}  # dep -> node closes node -> ... -> dep
    with pytest.raises(DependencyCycleError) as info:
        topo_order(deps)
    cycle = info.value.cycle
    assert cycle[0] == cycle[-1]
    assert all(b in deps[a] for a, b in zip(cycle, cycle[1:]))
