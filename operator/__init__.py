"""pagedkube.operator (torch-free): the kopf operator behind the LLMService resource.

    cli.py        `pagedkube operator`
    handlers.py   kopf handlers: thin routes to the Reconciler
    reconcile.py  desired children -> server-side apply; status from what runs
    spec.py       the LLMService spec as the operator reads it, defaults applied, validated
    model_spec.py spec.model: the weights' source (ModelSource) and the download cache's claim
    adapters.py   spec.adapters: LoRA adapter names and sources, parsed and checked
    naming.py     names, labels, images and owner references of the children
    crd.py        the CRD (schema, CEL rules), source of manifests/crd.yaml
    install.py    the operator's own install objects, source of manifests/install.yaml
    manifests.py  renders manifests/ from crd.py and install.py
    drift.py      does a live child still match what would be applied
    status.py     status and conditions from the engine Deployment and pods
    kube.py       a small Kubernetes client: get, list, server-side apply, delete
    builders/     the pure builders: one spec in, its child objects out
"""
