"""Which free workers a job takes: the fewest hosts, checked against every subset (synthetic
addresses), and on a real LocalCluster (all workers on one host)."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_tasks.coordinator.packing import choose_workers


def addr(host, i):
    return f"tcp://10.0.0.{host}:{4000 + i}"


def hosts(addresses):
    """The host part of our synthetic addresses, read by hand."""
    return {a.split("//")[1].rsplit(":", 1)[0] for a in addresses}


def fewest_hosts(free, n, held):
    """Brute force: the fewest hosts any n free workers span together with the held ones."""
    return min(len(hosts(set(c) | set(held))) for c in itertools.combinations(free, n))


@st.composite
def cases(draw):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    workers = [addr(h + 1, i) for h, size in enumerate(sizes) for i in range(size)]
    state = draw(st.lists(st.sampled_from(["free", "held", "other"]), min_size=len(workers), max_size=len(workers)))
    free = [w for w, s in zip(workers, state) if s == "free"]
    held = [w for w, s in zip(workers, state) if s == "held"]
    if not free:
        free, held = workers[:1], [w for w in held if w != workers[0]]
    n = draw(st.integers(1, len(free)))
    return draw(st.permutations(free)), n, held


@settings(max_examples=300, deadline=None)
@given(cases())
def test_chosen_workers_span_the_fewest_hosts_of_any_subset(case):
    free, n, held = case
    chosen = choose_workers(free, n, held)
    assert len(chosen) == n == len(set(chosen)) and set(chosen) <= set(free)
    assert len(hosts(set(chosen) | set(held))) == fewest_hosts(free, n, held)
    assert choose_workers(sorted(free), n, held) == chosen  # the input order does not matter
    # Ranks come grouped by host: each host's workers are contiguous.
    order = [a.split("//")[1].rsplit(":", 1)[0] for a in chosen]
    runs = [h for i, h in enumerate(order) if i == 0 or order[i - 1] != h]
    assert len(runs) == len(set(runs))


def test_most_free_host_first_and_best_fit_for_the_last():
    big = [addr(1, i) for i in range(4)]
    small = [addr(2, i) for i in range(2)]
    three = [addr(3, i) for i in range(3)]
    free = big + small + three
    assert choose_workers(free, 2) == small  # fits on one host: the smallest that does, big hosts stay whole
    assert choose_workers(free, 4) == big
    assert choose_workers(free, 6) == big + small  # largest first; the rest (2) best fits the 2-host
    assert choose_workers(free, 7) == big + three
    assert choose_workers(free, 3, held=[addr(2, 9)]) == small + [three[0]]  # a grow fills its own host first, then best fit
    with pytest.raises(ValueError, match="n=10"):
        choose_workers(free, 10)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_pool_packs_and_grows_a_job_on_its_hosts():
    from distributed import Client

    from deploy.local import local_gpu_cluster
    from elastic_tasks.cluster import WorkerPool, gpu_workers

    with local_gpu_cluster(3) as cluster, Client(cluster) as client:
        pool = WorkerPool(client)
        workers = gpu_workers(client)
        first = pool.take("a", 2)
        grown = pool.take("a", 1)
        assert sorted(first + grown) == workers and len(hosts(workers)) == 1  # one host here: any order spans it
        assert first == workers[:2]  # within a host, by address: as before packing
        with pytest.raises(ValueError, match="only 0 free"):
            pool.take("b", 1)
