"""`pagedkube generate` prints what LLM.generate returns (built-in model, in process)."""
import pytest

from pagedkube.cli import main
from pagedkube.engine import LLM, SamplingParams


def test_generate_prints_the_greedy_completion(capsys):
    assert main(["generate", "--model", "builtin://tiny", "--prompt", "Hello there", "--max-tokens", "5", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    expected = LLM("builtin://tiny", device="cpu").generate("Hello there", SamplingParams(temperature=0, max_tokens=5))[0]
    assert printed == expected.outputs[0].text + "\n"


def test_generate_bad_flag_value_is_a_clear_error(capsys):
    assert main(["generate", "--model", "builtin://tiny", "--prompt", "Hi", "--max-tokens", "0", "--device", "cpu"]) == 2
    assert "max_tokens must be an integer >= 1" in capsys.readouterr().err


def test_generate_quantization_flag(capsys):
    """--quantization int8 runs (builtin://tiny quantized at load); a bad value names the choices."""
    assert main(["generate", "--model", "builtin://tiny", "--prompt", "Hello there", "--max-tokens", "3",
                 "--device", "cpu", "--quantization", "int8"]) == 0
    assert capsys.readouterr().out.endswith("\n")
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "Hi", "--quantization", "fp8"])
    assert e.value.code == 2
    assert "invalid choice: 'fp8' (choose from 'auto', 'none', 'int8', 'int4')" in capsys.readouterr().err
