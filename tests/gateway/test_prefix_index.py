"""PrefixIndex: feed events in, match depths out; bounded LRU; resets."""
import pytest

from pagedkube.gateway.routing.prefix_index import PrefixIndex

A, B = "http://a:8000", "http://b:8000"
H = [bytes([i]) * 32 for i in range(10)]


def test_match_depth_is_the_leading_run_of_held_blocks():
    index = PrefixIndex()
    index.stored(A, H[:4], "ea")
    index.stored(B, [H[0], H[1], H[3]], "eb")
    assert index.match_depths(H[:5], [A, B, "http://c:8000"]) == {A: 4, B: 2, "http://c:8000": 0}
    index.removed(A, [H[1]], "ea")
    assert index.match_depths(H[:5], [A, B]) == {A: 1, B: 2}
    assert index.match_depths([], [A]) == {A: 0}


def test_capacity_evicts_least_recently_stored_first():
    index = PrefixIndex(capacity=3)
    index.stored(A, H[:3])
    index.stored(A, [H[0]])        # refresh H0: H1 is now the oldest
    index.stored(A, [H[5]])
    assert index.num_hashes(A) == 3
    assert [index.holds(A, h) for h in (H[0], H[1], H[2], H[5])] == [True, False, True, True]


def test_reset_and_engine_restart_replace_the_set():
    index = PrefixIndex()
    index.stored(A, H[:3], "old")
    index.reset(A, [H[7]], "old")
    assert index.match_depths(H[:3], [A]) == {A: 0} and index.holds(A, H[7])
    index.stored(A, [H[0]], "new")  # a different engine_id: the old hashes are gone
    assert not index.holds(A, H[7]) and index.engine_id(A) == "new"
    index.drop(A)
    assert index.num_hashes(A) == 0 and len(index) == 0
    with pytest.raises(ValueError):
        PrefixIndex(capacity=0)
