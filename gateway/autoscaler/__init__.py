"""Queue-depth autoscaler of the engine fleet (runs inside the gateway).

policy.py      desired replicas (HPA's rule) and stabilization windows, pure
hold.py        requests held while no engine is ready (scale from zero)
autoscaler.py  the loop: read the queue, decide, tell the ScaleTarget
target.py      the ScaleTarget interface; kube.py + lease.py implement it for
               Kubernetes, pagedkube.gateway.local for `pagedkube up`
"""
