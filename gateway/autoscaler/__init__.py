"""Queue-depth autoscaler of the engine fleet (runs inside the gateway).

policy.py      desired replicas from the work in flight against capacity, windows, pure
autoscaler.py  the loop: read the queue, decide, tell the ScaleTarget
target.py      the ScaleTarget interface; kube.py + lease.py implement it for
               Kubernetes, pagedkube.gateway.local for `pagedkube up`
wiring.py      builds the Autoscaler from its parts (the Gateway passes them)
cache_worth.py which engine's cache is worth least (among the least busy: the scale-in victim)
drain.py       drains the victims (engine POST/DELETE /drain) before the scale-in removes them
flags.py       the autoscaling flags, shared by `pagedkube gateway` and `pagedkube up`
metrics.py     pagedkube_autoscaler_* metrics
The requests held while no engine is ready (scale from zero) sit on the request
path: gateway/hold.py, beside the proxy. The queue depth and cache hits come from
the engine watcher's scrape (gateway/engine_metrics.py), read from the EndpointSet.
"""
