"""Constraints -> xgrammar grammars: checked, compiled off the loop, cached.

Why xgrammar (vLLM's default backend) and not llguidance: measured on this
project's machines (docs/benchmarks.md "Structured outputs: backend"), its
token mask costs ~5 us per token against llguidance's ~75 us on SmolLM2's
49K vocabulary, and its compile (~10 ms for a form-sized schema, once per
schema thanks to the cache) releases the GIL, so it runs in a thread beside
the step loop and the HTTP event loop.

Two stages:
- `parse(params)` builds the tokenizer-free grammar (schema, regex, EBNF or
  Lark parsing): cheap, and where every malformed or unsupported constraint is
  refused with a ValueError naming the field. The HTTP process calls it before
  a request reaches the engine, so those are 400s.
- `GrammarCompiler.compile(params)` turns it into a token-level grammar for one
  tokenizer, in a small thread pool, returning a Future. Identical constraints
  (StructuredOutputsParams.key) share one Future: compiled once, then cached
  (LRU of `cache_size` grammars). A compile cannot be interrupted, so the
  input size is bounded first (params.MAX_SPEC_BYTES) and the caller bounds
  the time from when a compile thread takes it up (`future.started`) to its
  end (EngineConfig.grammar_compile_timeout): a burst of new schemas queues
  without failing, one that compiles too long fails its requests.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pagedkube.engine.structured.json_schema import enforceable
from pagedkube.engine.structured.params import StructuredOutputsParams

log = logging.getLogger(__name__)

# JSON is generated in json.dumps's default layout, {"a": 1, "b": [2, 3]}: the layout models
# have seen most, and no free whitespace, which small models fill to max_tokens with blanks
# (measured with the built-in model: docs/server.md "Structured outputs").
# disable_any_whitespace gives the compact one, {"a":1,"b":[2,3]}.
JSON_SEPARATORS = (", ", ": ")
COMPACT_SEPARATORS = (",", ":")
DEFAULT_CACHE_SIZE = 256     # compiled grammars kept (a form-sized one holds ~1 MB of masks)
DEFAULT_COMPILE_THREADS = 2


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as exc:  # an engine installed without its structured-outputs dependency
        raise ValueError("structured outputs need the xgrammar package (pip install 'pagedkube[engine]')") from exc
    return xgrammar


def _library_message(exc: Exception) -> str:
    """xgrammar's error without its C++ source location prefix."""
    text = str(exc).strip().splitlines()
    last = text[-1] if text else type(exc).__name__
    return last.split(": ", 1)[1] if last.startswith("[") and ": " in last else last


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF matching exactly one of the strings (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def parse(params: StructuredOutputsParams) -> Any:
    """The tokenizer-free xgrammar Grammar of a constraint; ValueError (naming the field) if it
    cannot be honoured."""
    xgr = _xgr()
    kind = params.kind
    whitespace = dict(any_whitespace=False,
                      separators=COMPACT_SEPARATORS if params.disable_any_whitespace else JSON_SEPARATORS)
    try:
        if kind == "json":
            if params.json is True or params.json == {}:
                return xgr.Grammar.builtin_json_grammar()
            if params.json is False:
                raise ValueError("json: the schema `false` accepts no output")
            schema, problems = enforceable(params.json)
            if problems:
                raise ValueError(f"json: the schema uses keywords this server cannot enforce: {', '.join(problems[:5])}")
            return xgr.Grammar.from_json_schema(json.dumps(schema), **whitespace)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type":"object"}', strict_mode=False, **whitespace)
        if kind == "regex":
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_grammar(tuple(params.choice or ())))
        grammar = params.grammar or ""
        if "::=" in grammar:
            return xgr.Grammar.from_ebnf(grammar)
        return xgr.Grammar.from_lark(grammar)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError for every malformed input
        raise ValueError(f"{kind}: {_library_message(exc)}") from None


class GrammarState:
    """One sequence's position in its grammar (an xgrammar GrammarMatcher)."""
    __slots__ = ("matcher",)

    def __init__(self, matcher: Any):
        self.matcher = matcher

    def fill(self, bitmask: Any, row: int) -> None:
        """The next-token mask into bitmask[row]. A grammar that has ended allows only its stop
        tokens (the engine stops such a sequence first; xgrammar would raise, failing the step)."""
        if self.matcher.is_terminated():
            bitmask[row] = 0
            for token in self.matcher.stop_token_ids:
                bitmask[row, token // 32] |= 1 << (token % 32)
            return
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()


class GrammarCompiler:
    """Compiles constraints for one tokenizer (xgrammar's TokenizerInfo) in a thread pool.

    The tokenizer tables (0.2 s for a 49K vocabulary, 0.6 s for 152K) are built by the first
    compile, in the pool, not by the constructor: the engine makes its compiler on the step
    loop when the first constrained request arrives."""

    def __init__(self, tokenizer_json: str, vocab_size: int, stop_token_ids: list[int], *,
                 cache_size: int = DEFAULT_CACHE_SIZE, threads: int = DEFAULT_COMPILE_THREADS):
        _xgr()                         # a missing library fails the first constrained request here
        self._tokenizer_json = tokenizer_json
        self._stop_token_ids = list(stop_token_ids)
        self.vocab_size = vocab_size
        self._compiler: Any = None
        self._tables_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()  # the cache is touched by the caller and by the pool's done callbacks
        self.cache_size = cache_size
        self.num_compiles = 0          # cold compiles started (tests and metrics read it)

    def compile(self, params: StructuredOutputsParams) -> Future:
        """A Future of the compiled grammar; done at once when cached. Its exception is a
        ValueError naming the field when the constraint cannot be honoured."""
        key = params.key
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                return future
            started: list[float] = []      # the time a compile thread took it up, once it has
            future = self._pool.submit(self._compile, params, started)
            future.started = started       # type: ignore[attr-defined]  # read by StructuredOutputManager.poll
            self.num_compiles += 1
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

        def forget_failure(done: Future) -> None:
            # A failed compile is not cached: the same constraint fails again by itself (in parse, cheaply).
            if done.exception() is not None:
                with self._lock:
                    if self._cache.get(key) is done:
                        del self._cache[key]

        future.add_done_callback(forget_failure)
        return future

    def _xgrammar_compiler(self) -> Any:
        """xgrammar's compiler over this tokenizer's tables, built once (in a pool thread)."""
        with self._tables_lock:
            if self._compiler is None:
                xgr = _xgr()
                from tokenizers import Tokenizer as HFTokenizer
                from transformers import PreTrainedTokenizerFast

                hf = PreTrainedTokenizerFast(tokenizer_object=HFTokenizer.from_str(self._tokenizer_json))
                info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size,
                                                          stop_token_ids=self._stop_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def _compile(self, params: StructuredOutputsParams, started: list[float]) -> Any:
        compiler = self._xgrammar_compiler()
        started.append(time.monotonic())   # the deadline is the compile's own, not the tables'
        grammar = parse(params)
        try:
            return compiler.compile_grammar(grammar)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{params.kind}: {_library_message(exc)}") from None

    def state(self, compiled: Any) -> GrammarState:
        return GrammarState(_xgr().GrammarMatcher(compiled))

    def allocate_bitmask(self, rows: int) -> Any:
        return _xgr().allocate_token_bitmask(rows, self.vocab_size)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
