"""Chat templates wherever Hugging Face keeps them (docs/design.md "Models", docs/design.md, pitfall "Chat templates moved").

One test per location, each rendering the same chats with our torch-free Tokenizer and with
transformers' apply_chat_template on the same folder (or file), and the precedence when a
folder has several. The gateway builds its Tokenizer from the files the engine serves
(GET /v1/cache/tokenizer is Tokenizer.files), so each test also renders from those files.
"""
from __future__ import annotations

import json
import shutil

import pytest

from gguf_factory import TEMPLATE, write_tiny_gguf
from model_factory import BUILTIN_TINY
from pagedkube.tokenizer import Tokenizer

CHATS = [
    [{"role": "user", "content": "My dog barks at night. What should I do?"}],
    [{"role": "system", "content": "You are a vet."}, {"role": "user", "content": "Biscuit limps."},
     {"role": "assistant", "content": "Since when?"}, {"role": "user", "content": "Two days."}],
]
JINJA = "{% for m in messages %}[J {{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[J assistant]{% endif %}"
JSON_T = "{% for m in messages %}[S {{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[S assistant]{% endif %}"
CONFIG_T = "{% for m in messages %}[C {{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[C assistant]{% endif %}"


def _folder(tmp_path, jinja=None, json_template=None, config_template=None):
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(BUILTIN_TINY / "tokenizer.json", d)
    config = json.loads((BUILTIN_TINY / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if config_template:
        config["chat_template"] = config_template
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja:
        (d / "chat_template.jinja").write_text(jinja)
    if json_template:
        (d / "chat_template.json").write_text(json.dumps({"chat_template": json_template}))
    return d


def _ours(path) -> list[str]:
    tok = Tokenizer.from_pretrained(path)
    via_feed = Tokenizer(tok.files)          # what the gateway builds from /v1/cache/tokenizer
    rendered = [tok.render_chat(chat) for chat in CHATS]
    assert [via_feed.render_chat(chat) for chat in CHATS] == rendered
    return rendered


def _transformers(hf_tok, **kw) -> list[str]:
    return [hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **kw) for chat in CHATS]


def test_chat_template_jinja(tmp_path):
    from transformers import AutoTokenizer
    d = _folder(tmp_path, jinja=JINJA)
    assert _ours(d) == _transformers(AutoTokenizer.from_pretrained(d))
    assert _ours(d)[0].startswith("[J user]")


def test_chat_template_json(tmp_path):
    """The processors' legacy file. AutoTokenizer does not read it (AutoProcessor does); so
    transformers' renderer is given the template the file holds."""
    from transformers import AutoTokenizer
    d = _folder(tmp_path, json_template=JSON_T)
    expected = _transformers(AutoTokenizer.from_pretrained(d), chat_template=JSON_T)
    assert _ours(d) == expected
    assert expected[0].startswith("[S user]")


def test_chat_template_in_tokenizer_config(tmp_path):
    from transformers import AutoTokenizer
    d = _folder(tmp_path, config_template=CONFIG_T)
    assert _ours(d) == _transformers(AutoTokenizer.from_pretrained(d))
    assert _ours(d)[0].startswith("[C user]")


def test_chat_template_in_gguf_metadata(tmp_path):
    """A GGUF keeps it as tokenizer.chat_template; the engine's converted folder carries it."""
    from transformers import AutoTokenizer

    from pagedkube.engine.gguf.prepare import gguf_model_dir
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2", "F32")
    ours = _ours(gguf_model_dir(path))
    assert ours == _transformers(AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name))
    assert ours[0] == "<|im_start|>user\nMy dog barks at night. What should I do?<|im_end|>\n<|im_start|>assistant\n"
    assert TEMPLATE


@pytest.mark.parametrize("present, wins", [
    (dict(jinja=JINJA, json_template=JSON_T, config_template=CONFIG_T), "[J user]"),
    (dict(json_template=JSON_T, config_template=CONFIG_T), "[S user]"),
])
def test_precedence_jinja_then_json_then_tokenizer_config(tmp_path, present, wins):
    from transformers import AutoTokenizer
    d = _folder(tmp_path, **present)
    ours = _ours(d)
    assert ours[0].startswith(wins)
    if "jinja" in present:   # a tokenizer load sees .jinja over tokenizer_config.json, as we do
        assert ours == _transformers(AutoTokenizer.from_pretrained(d))


def test_no_template_anywhere_is_a_clear_error(tmp_path):
    tok = Tokenizer.from_pretrained(_folder(tmp_path))
    with pytest.raises(ValueError, match="no chat template"):
        tok.render_chat(CHATS[0])


def test_chat_template_json_that_is_not_an_object_is_a_clear_error(tmp_path):
    d = _folder(tmp_path)
    (d / "chat_template.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="chat_template.json"):
        Tokenizer.from_pretrained(d)
