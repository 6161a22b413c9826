"""An engine factory with one injected fault, for tests/server/test_engine_faults.py.

It lives in a plain module on sys.path (pyproject: pythonpath = ["tests/helpers"]) because the
engine core runs in a spawned process that imports the factory by name; a function
in a test module loaded with --import-mode=importlib cannot be imported there.
"""
from pagedkube.engine.config import EngineConfig

FAIL_MARK = "<<fail-the-step>>"


def faulty_engine(kv_event_sink=None):
    from pagedkube.engine.llm_engine import LLMEngine

    class FaultyEngine(LLMEngine):
        def step_deltas(self):
            if any(FAIL_MARK in (state.params.stop or []) for state in self._requests.values()):
                raise RuntimeError("injected fault")
            return super().step_deltas()
    return FaultyEngine(EngineConfig(model="builtin://tiny", device="cpu", max_model_len=256, num_kv_blocks=64), kv_event_sink=kv_event_sink)
