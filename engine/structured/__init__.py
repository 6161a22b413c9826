"""Structured outputs: constrained decoding by token bitmasks (xgrammar).

    params.py          StructuredOutputsParams: the request's constraint, checked (torch-free)
    json_schema.py     the JSON Schema keywords a grammar cannot enforce (refused, not ignored)
    grammars.py        parse (400s) and compile (thread pool, cached) with xgrammar
    manager.py         the engine's seam: park until compiled, fill bitmasks, advance grammars
    bitmask.py         apply a bitmask to the logits (torch; Triton on CUDA: triton_bitmask.py)

Importing this package imports neither torch nor xgrammar.
"""
