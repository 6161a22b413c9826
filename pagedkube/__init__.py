"""pagedkube: Kubernetes-native LLM serving.

The root package holds only torch-free code shared by the parts: the CLI, the
chained block hashing that the engine and the gateway must agree on, and the
tokenizer wrapper. The parts live in pagedkube.engine, pagedkube.gateway and
pagedkube.operator (folders engine/, gateway/ and operator/ in the repository).
"""

__version__ = "0.1.0"
