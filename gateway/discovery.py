"""Where the engines are: a static list, or the EndpointSlices of a Service.

Kubernetes: watch discovery.k8s.io/v1 EndpointSlices labelled
`kubernetes.io/service-name=<service>` in the namespace. An endpoint is
`ready` when its `ready` condition is true (nil counts as true, as the API
documents) and it is not `terminating`; its URL is http://<first address>:<port
named "http">. Every watch event replaces that slice's endpoints in the merged
set at once, so a pod that turns not-ready gets no new requests from then on.
The kubernetes client is synchronous: the watch runs in a thread and hands each
new set to the event loop.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable, Mapping

from pagedkube.gateway.endpoints import NOT_READY, READY, TERMINATING, EndpointSet

log = logging.getLogger("pagedkube.gateway")

PORT_NAME = "http"
SERVICE_LABEL = "kubernetes.io/service-name"


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError("empty endpoint URL")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"endpoint URL must be http(s)://HOST:PORT, got {url!r}")
    return url


def _get(obj: Any, *names: str) -> Any:
    """Field access that works on API dicts (camelCase) and client models (snake_case)."""
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return None


def slice_endpoints(slice_obj: Any, port_name: str = PORT_NAME) -> dict[str, str]:
    """URL -> ready | not_ready | terminating for one EndpointSlice."""
    ports = _get(slice_obj, "ports") or []
    port = next((_get(p, "port") for p in ports if _get(p, "name") == port_name), None)
    if port is None and len(ports) == 1:
        port = _get(ports[0], "port")
    if port is None:
        return {}
    out: dict[str, str] = {}
    for endpoint in _get(slice_obj, "endpoints") or []:
        addresses = _get(endpoint, "addresses") or []
        if not addresses:
            continue
        conditions = _get(endpoint, "conditions") or {}
        ready = _get(conditions, "ready")
        terminating = _get(conditions, "terminating")
        host = addresses[0]
        if ":" in host:  # IPv6
            host = f"[{host}]"
        if terminating:
            state = TERMINATING
        elif ready is None or ready:
            state = READY
        else:
            state = NOT_READY
        out[f"http://{host}:{port}"] = state
    return out


def slice_pod_names(slice_obj: Any, port_name: str = PORT_NAME) -> dict[str, str]:
    """URL (as slice_endpoints builds it) -> the name of the pod behind it, for one EndpointSlice."""
    out: dict[str, str] = {}
    ports = _get(slice_obj, "ports")
    for endpoint in _get(slice_obj, "endpoints") or []:
        ref = _get(endpoint, "targetRef", "target_ref") or {}
        name = _get(ref, "name")
        if (_get(ref, "kind") or "Pod") != "Pod" or not name:
            continue
        for url in slice_endpoints({"ports": ports, "endpoints": [endpoint]}, port_name):
            out[url] = name
    return out


class SliceSet:
    """The merged view of a Service's EndpointSlices."""

    def __init__(self, service: str | None = None) -> None:
        self.service = service
        self.slices: dict[str, dict[str, str]] = {}
        self.pod_names: dict[str, dict[str, str]] = {}

    def apply(self, event_type: str, slice_obj: Any) -> dict[str, str]:
        metadata = _get(slice_obj, "metadata")
        name = _get(metadata, "name")
        labels = _get(metadata, "labels") or {}
        if self.service is not None and labels.get(SERVICE_LABEL) != self.service:
            return self.merged()  # the label selector already filters; this guards against an API that does not
        if event_type == "DELETED":
            self.slices.pop(name, None)
            self.pod_names.pop(name, None)
        else:
            self.slices[name] = slice_endpoints(slice_obj)
            self.pod_names[name] = slice_pod_names(slice_obj)
        return self.merged()

    def names(self) -> dict[str, str]:
        return {url: pod for names in self.pod_names.values() for url, pod in names.items()}

    def merged(self) -> dict[str, str]:
        # An address in two slices (a transient during updates) is ready if either says so.
        rank = {READY: 2, NOT_READY: 1, TERMINATING: 0}
        out: dict[str, str] = {}
        for endpoints in self.slices.values():
            for url, state in endpoints.items():
                if url not in out or rank[state] > rank[out[url]]:
                    out[url] = state
        return out


class KubeDiscovery:
    def __init__(self, endpoints: EndpointSet, service: str, namespace: str,
                 api_factory: Callable[[], Any] | None = None, watch_timeout: float = 60.0):
        self.endpoints = endpoints
        self.service = service
        self.namespace = namespace
        # The API server ends a watch after timeoutSeconds; the client gives up a few
        # seconds later, in case the server (or a proxy) keeps an idle stream open.
        self.watch_timeout = watch_timeout
        self._api_factory = api_factory or _default_api
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._api: Any = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        api = self._api = self._api_factory()
        self._thread = threading.Thread(target=self._run, args=(loop, api), name="endpointslice-watch",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the watch: the thread leaves at once, its open watch request is closed."""
        self._stop.set()
        api = self._api
        if api is not None:
            try:
                api.api_client.rest_client.pool_manager.clear()  # unblocks a read on the watch stream
            except Exception:  # noqa: BLE001  best effort: the thread is a daemon and exits on its next event anyway
                pass

    def _run(self, loop: asyncio.AbstractEventLoop, api: Any) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        selector = f"{SERVICE_LABEL}={self.service}"
        while not self._stop.is_set():
            slices = SliceSet(self.service)
            try:
                listing = api.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                for item in listing.items:
                    slices.apply("ADDED", item)
                loop.call_soon_threadsafe(self.endpoints.update, slices.merged(), slices.names())
                version = listing.metadata.resource_version
                w = watch.Watch()
                for event in w.stream(api.list_namespaced_endpoint_slice, self.namespace,
                                      label_selector=selector, resource_version=version,
                                      timeout_seconds=max(1, int(self.watch_timeout)),
                                      _request_timeout=self.watch_timeout + 5):
                    if self._stop.is_set():
                        w.stop()
                        return
                    merged = slices.apply(event["type"], event["object"])
                    loop.call_soon_threadsafe(self.endpoints.update, merged, slices.names())
            except ApiException as e:  # 410 Gone: resourceVersion too old -> list again
                if e.status != 410:
                    log.warning("EndpointSlice watch of %s/%s: %s", self.namespace, self.service, e)
                    self._stop.wait(2.0)
            except Exception as e:  # noqa: BLE001  network errors: keep the last known set, retry
                if self._stop.is_set():
                    return
                if "timed out" in str(e).lower():  # an idle watch the client ended: list and watch again
                    continue
                log.warning("EndpointSlice watch of %s/%s: %s", self.namespace, self.service, e)
                self._stop.wait(2.0)


def _default_api():
    try:
        import kubernetes
    except ImportError as e:  # pragma: no cover - the gateway extra installs it
        raise SystemExit("--kube-service needs the kubernetes package: pip install 'pagedkube[gateway]'") from e
    from pagedkube.kube_call import load_kube_credentials
    load_kube_credentials(kubernetes)
    return kubernetes.client.DiscoveryV1Api()
