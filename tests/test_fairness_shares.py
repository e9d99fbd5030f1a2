"""Team entitlements (allocator.fairness.shares) and the teams file (allocator.fairness.teams).

Oracles are written here from the rules' definitions: the guarantee min(nominal, demand), the
total min(capacity, demand), lending by class first, then weighted max-min (no GPU could move
from one borrower to another that is further below it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.fairness.priority import PRIORITY_CLASSES, priority_name, priority_value
from allocator.fairness.shares import apportion, entitlements, nominal_shares
from allocator.fairness.teams import Team, TeamTable, teams_from_dict, teams_to_dict
from tests.factories import make_job

TEAMS = ("a", "b", "c", "d")


@st.composite
def cohorts(draw):
    capacity = draw(st.integers(1, 64))
    names = TEAMS[: draw(st.integers(1, 4))]
    # Mostly quotas that fit the cluster (as configured); sometimes none at all for a team.
    nominal = {}
    left = capacity
    for n in names:
        q = draw(st.integers(0, left))
        nominal[n] = q
        left -= q
    weights = {n: draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for n in names}
    demand = {}
    for n in names:
        tiers = draw(st.dictionaries(st.sampled_from([-100, 0, 100]), st.integers(0, 40), max_size=3))
        if tiers:
            demand[n] = tiers
    return capacity, nominal, weights, demand


@settings(max_examples=300, deadline=None)
@given(cohorts())
def test_entitlements_guarantee_the_quota_lend_the_rest_by_class_then_weight(case):
    capacity, nominal, weights, demand = case
    out = entitlements(capacity, nominal, weights, demand)
    asks = {t: sum(demand.get(t, {}).values()) for t in nominal}
    guaranteed = {t: min(nominal[t], asks[t]) for t in nominal}
    assert sum(out.values()) == min(capacity, sum(asks.values()))
    for t in nominal:
        assert guaranteed[t] <= out[t] <= asks[t], (t, out, guaranteed, asks)
    # What each team borrows serves its classes top-down after its guarantee: the lowest class
    # its entitlement reaches into, per team.
    def unmet_by_class(t, amount):
        left, out_ = amount, {}
        for p in sorted(demand.get(t, {}), reverse=True):
            take = min(left, demand[t][p])
            left -= take
            out_[p] = demand[t][p] - take
        return out_

    borrowed = {t: out[t] - guaranteed[t] for t in nominal}
    lowest_lent = {}
    for t in nominal:
        if borrowed[t] > 0:
            served = [p for p, d in sorted(demand[t].items(), reverse=True) if unmet_by_class(t, out[t])[p] < d]
            lowest_lent[t] = min(served)
    for t, p in lowest_lent.items():
        for u in nominal:
            # No team is left wanting in a class above one that was lent GPUs.
            assert all(v == 0 for q, v in unmet_by_class(u, out[u]).items() if q > p), (t, p, u, out)
            # Within the class: moving a GPU from t to a still-wanting u would not even them out.
            if u != t and unmet_by_class(u, out[u]).get(p, 0) > 0:
                assert (borrowed[u] + 1) / weights[u] >= borrowed[t] / weights[t] - 1e-12, (t, u, out, borrowed)


def test_a_worked_example_two_teams_and_an_idle_third():
    # 64 GPUs: research 32, product 16, platform 16 and idle. Research asks 60 (nightly 8 of it).
    nominal = {"research": 32, "product": 16, "platform": 16}
    demand = {"research": {0: 52, 100: 8}, "product": {0: 24}}
    out = entitlements(64, nominal, {"research": 1.0, "product": 1.0, "platform": 1.0}, demand)
    # platform's 16 are lent: research and product each want more, 8 + 8 by equal weight.
    assert out == {"research": 40, "product": 24, "platform": 0}
    # Product's nightly work would be lent first.
    out = entitlements(64, nominal, {"research": 1.0, "product": 1.0, "platform": 1.0}, {"research": {0: 52}, "product": {0: 16, 100: 16}})
    assert out == {"research": 32 + 8, "product": 16 + 8, "platform": 0}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.dictionaries(st.sampled_from(TEAMS), st.floats(0.1, 10.0), min_size=1))
def test_apportion_is_within_one_of_the_exact_proportion(total, weights):
    out = apportion(total, weights)
    assert sum(out.values()) == total
    mass = sum(weights.values())
    for k, w in weights.items():
        assert abs(out[k] - total * w / mass) < 1.0


def test_nominal_shares_quotas_first_weights_split_the_rest_and_quotas_shrink_with_the_cluster():
    # The default team (weight 1 unless configured) takes part in the split of what quotas leave.
    table = TeamTable((Team("a", quota=30), Team("b", weight=3.0), Team("c", weight=1.0)))
    assert nominal_shares(table, 70, table.names()) == {"a": 30, "b": 24, "c": 8, "default": 8}
    table = TeamTable((Team("a", quota=30), Team("b", weight=3.0), Team("default", quota=0)))
    assert nominal_shares(table, 70, table.names()) == {"a": 30, "b": 40, "default": 0}
    # Workers lost: quotas above the cluster scale down together.
    table = TeamTable((Team("a", quota=30), Team("b", quota=10)))
    assert nominal_shares(table, 20, table.names()) == {"a": 15, "b": 5, "default": 0}


def test_members_decide_the_team_patterns_and_user_parts_match_unlisted_go_to_the_default():
    table = TeamTable((Team("research", members=("alice", "retrain:*")), Team("product", members=("bob@ci-*",))), default="others")
    assert table.team_of_submitter("alice@laptop") == "research"
    assert table.team_of_submitter("retrain:elastic_tasks.examples:mlp_tiny") == "research"
    assert table.team_of_submitter("bob@ci-7") == "product"
    assert table.team_of_submitter("bob@laptop") == "others"
    assert table.team_of_submitter(None) == "others"
    assert table.team_of(make_job("x", submitter="alice")) == "research"
    assert table.team_of(make_job("x", submitter="alice", team="product")) == "product"  # a simulation's job may say its team


def test_teams_file_round_trips_and_bad_input_is_one_line_naming_the_field():
    data = {"default_team": "others", "teams": {"research": {"quota": 48, "members": ["alice"]}, "product": {"weight": 2}}}
    table = teams_from_dict(data)
    assert teams_from_dict(teams_to_dict(table)) == table
    cases = [
        ({"teams": {"a": {"quota": -1}}}, "teams.a"),
        ({"teams": {"a": {"quota": 2.5}}}, "quota=2.5"),
        ({"teams": {"a": {"weight": 0}}}, "weight=0"),
        ({"teams": {"a": {"members": "alice"}}}, "members='alice'"),
        ({"teams": {"a": {"quotas": 3}}}, "teams.a.quotas: unknown field"),
        ({"teams": {}}, "at least one team"),
        ({"team": {}}, "team: unknown top-level field"),
        ([], "expected a mapping"),
    ]
    for bad, needle in cases:
        with pytest.raises(ValueError) as err:
            teams_from_dict(bad)
        assert needle in str(err.value) and "\n" not in str(err.value), (bad, str(err.value))


def test_priority_classes_by_name_or_number():
    assert priority_value("nightly") == PRIORITY_CLASSES["nightly"] > priority_value("default") > priority_value("best_effort")
    assert priority_value(7) == 7 and priority_name(7) == "7" and priority_name(100) == "nightly"
    with pytest.raises(ValueError, match="priority='urgent': unknown priority class"):
        priority_value("urgent")
    with pytest.raises(ValueError, match="must be a priority class"):
        priority_value(True)


def test_jobs_files_carry_team_submitter_and_a_priority_class_through_the_record():
    from allocator.profiles.io import profile_to_dict
    from allocator.specs import job_from_dict, spec_from_dict, spec_to_dict
    from tests.factories import make_profile

    entry = {"id": "n", "profile": profile_to_dict(make_profile()), "samples": 10, "min_batch": 1, "max_batch": 8, "max_gpus": 2,
             "priority": "nightly", "team": "research", "submitter": "retrain:nightly"}  # fmt: skip
    spec = job_from_dict(entry, 0, {})
    assert (spec.priority, spec.team, spec.submitter) == (PRIORITY_CLASSES["nightly"], "research", "retrain:nightly")
    assert spec_from_dict(spec_to_dict(spec)) == spec
    for field, value, needle in (("team", "", "team=''"), ("team", 3, "team=3"), ("priority", "urgent", "priority='urgent'")):
        with pytest.raises(ValueError) as err:
            job_from_dict({**entry, field: value}, 0, {})
        assert needle in str(err.value) and "job 'n'" in str(err.value), str(err.value)


def test_traces_carry_team_submitter_and_priority_both_ways():
    from allocator.workloads.trace import TraceError, read_trace, write_trace
    from tests.factories import make_profile

    profiles = {"w": make_profile()}
    text = "name,submit_s,samples,min_batch,max_batch,max_gpus,profile,team,submitter,priority\n" "a,0,100,1,8,2,w,research,alice,nightly\n" "b,5,100,1,8,2,w,,bob,-3\n"
    a, b = read_trace(text, "csv", profiles)
    assert (a.team, a.submitter, a.priority) == ("research", "alice", PRIORITY_CLASSES["nightly"])
    assert (b.team, b.submitter, b.priority) == (None, "bob", -3)
    for fmt in ("csv", "json"):
        assert read_trace(write_trace([a, b], fmt, profiles), fmt, profiles) == [a, b]
    with pytest.raises(TraceError, match="row 1, column priority='urgent'"):
        read_trace(text.replace("nightly", "urgent"), "csv", profiles)
