"""Output processing without a model: streaming detokenization, stop strings, hold-back."""
import random

import pytest

from pagedkube.builtin import resolve_model
from pagedkube.engine.kv_cache_manager import KVCacheManager
from pagedkube.engine.output_processor import RequestState, StreamDetokenizer
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler
from pagedkube.engine.sequence import SampleOutput, Sequence
from pagedkube.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_pretrained(resolve_model(None))


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_stream_detokenizer_equals_full_decode(tokenizer, skip_special_tokens):
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
        detok = StreamDetokenizer(tokenizer, skip_special_tokens)
        for i in ids:
            detok.add([i])
        full = tokenizer.decode(ids, skip_special_tokens)
        assert full.startswith(detok.text) and (detok.text == full or full.endswith("\ufffd"))


def run_tokens(tokenizer, token_ids, params):
    kv = KVCacheManager(16, 4)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    seq = Sequence("r", [1, 2, 3], params)
    sched.add_request([seq])
    state = RequestState.create("r", None, [seq], tokenizer)
    texts = []
    for token_id in token_ids:
        batch = sched.schedule()
        (update,) = sched.postprocess(batch, [SampleOutput(token_id)])
        state.apply(update, sched)
        out = state.to_output()
        texts.append(out.outputs[0].text)
        if out.finished:
            break
    assert kv.num_free_blocks == 16          # finished through the scheduler: freed
    return seq, texts, out


def test_stop_string_cuts_text_and_ends_generation(tokenizer):
    ids = tokenizer.encode("Hello world, please stop here now", add_special_tokens=False)
    seq, texts, out = run_tokens(tokenizer, ids, SamplingParams(max_tokens=20, stop=["stop here"]))
    assert out.finished and out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == "stop here"
    assert out.outputs[0].text == "Hello world, please "
    assert len(seq.output_token_ids) == 8           # up to " he" "re": where "stop here" completed
    # while running, text never shows a possible stop-string start and only grows
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[5] == "Hello world, ple"          # "Hello world, please stop" minus 8 held back


def test_include_stop_str_and_length(tokenizer):
    ids = tokenizer.encode("Hello world, please stop here now", add_special_tokens=False)
    _, _, out = run_tokens(tokenizer, ids, SamplingParams(max_tokens=20, stop="stop", include_stop_str_in_output=True))
    assert out.outputs[0].text == "Hello world, please stop"
    _, texts, out = run_tokens(tokenizer, ids, SamplingParams(max_tokens=3))
    assert out.outputs[0].finish_reason == "length" and out.outputs[0].text == "Hello world"
    assert texts == ["Hello", "Hello wor", "Hello world"]
