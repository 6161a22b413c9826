"""KVEventLog: the cache feed's JSON, fed by a real BlockPool (torch-free)."""
import pytest

from pagedkube.engine.block_pool import BlockPool
from pagedkube.engine.kv_events import KVEventLog
from pagedkube.hashing import block_hashes, to_hex


def test_events_from_pool_then_reset_when_behind():
    log = KVEventLog(max_events=2, engine_id="e1")
    pool = BlockPool(2, 2, event_sink=log.record)
    assert log.events_after(0) == {"engine_id": "e1", "latest_seq": 0, "reset": False, "events": []}
    tokens = [1, 2, 3, 4]
    hashes = block_hashes(tokens, 2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, hashes, tokens)                 # seq 1: stored both
    pool.free_blocks(reversed(blocks))                             # queue: block 1, block 0
    assert log.events_after(0)["events"] == [{"seq": 1, "type": "stored", "block_hashes": to_hex(hashes)}]
    new = pool.get_new_blocks(1)                                   # seq 2: evicts block 1's hash
    assert new[0].block_id == 1
    assert log.events_after(1) == {"engine_id": "e1", "latest_seq": 2, "reset": False,
                                   "events": [{"seq": 2, "type": "removed", "block_hashes": [hashes[1].hex()]}]}
    pool.cache_full_blocks(new, block_hashes([9, 9], 2), [9, 9])   # seq 3; seq 1 falls out of the window
    assert [e["seq"] for e in log.events_after(1)["events"]] == [2, 3]
    behind = log.events_after(0)
    assert behind["reset"] and behind["events"] == [] and behind["latest_seq"] == 3
    assert behind["block_hashes"] == [hashes[0].hex(), block_hashes([9, 9], 2)[0].hex()]
    assert sorted(behind["block_hashes"]) == sorted(h.hex() for h in pool.cached_hashes())
    assert log.events_after(3)["events"] == [] and not log.events_after(3)["reset"]
    assert log.events_after(7)["reset"]        # newer than latest: e.g. the engine restarted
    assert log.events_after(-1)["reset"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_events"):
        KVEventLog(max_events=0)
    with pytest.raises(ValueError, match="event type"):
        KVEventLog().record("evicted", [])
    assert KVEventLog().engine_id != KVEventLog().engine_id
