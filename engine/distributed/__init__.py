"""Tensor parallelism: one engine over N ranks, each holding 1/N of every layer (`--tensor-parallel-size`).

Rank 0 is the process that owns the scheduler, the block tables, the prefix cache and the
cache feed, exactly as at TP=1; it starts ranks 1..N-1 as worker processes and broadcasts each
step's inputs to them once. With --nnodes K the ranks span K pods: the other pods' ranks are
started by `pagedkube serve-worker` and join through rank 0's TCPStore. Every rank runs the
same decoder on its shard (heads, KV heads, MLP columns, vocabulary rows), with one all-reduce
after each row-parallel projection; the logits are gathered to rank 0, whose sampler (and
grammar bitmask) works unchanged.
docs/engine.md "Tensor parallelism" is the user's account.

    errors.py     WorkerFailed: a rank died or hung, fatal to the engine (torch-free)
    group.py      TPGroup: all-reduce, gather to rank 0 and the step broadcast, with byte counts
    checks.py     start-up checks: heads, KV heads and MLP divisible by N (torch-free)
    sharding.py   which rows or columns of each checkpoint tensor a rank holds
    layers.py     RowParallel, VocabParallelEmbedding, ParallelLMHead, swapped in after loading
    rendezvous.py the start-up handshake on the TCPStore: the config, each rank's ready, the agreed pool
    executor.py   rank 0's side: starts the workers, agrees the KV pool size, broadcasts steps
    worker.py     a worker process: loads its shard, then runs the broadcast steps
    node.py       a worker node of a multi-node engine (`pagedkube serve-worker`): its ranks, supervised
"""
