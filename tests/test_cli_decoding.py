"""`transformers-static generate --num-beams N --num-return-sequences N --prompt-lookup K --assistant DIR`: one
printed line per sequence, the tokens upstream's generate makes for the same checkpoint; refusals as usage
errors."""

from __future__ import annotations

import pytest
import torch
import transformers

from transformers_static.commands import main

from .models.causal_lm_tester import perturb

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, transformers.PreTrainedModel]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=None,
    )
    upstream = perturb(transformers.LlamaForCausalLM(config), 0.1).eval()
    path = str(tmp_path_factory.mktemp("cli_llama"))
    upstream.save_pretrained(path)
    return path, upstream


def printed_sequences(capsys: pytest.CaptureFixture[str], path: str, *options: str) -> list[list[int]]:
    ids = ",".join(map(str, PROMPT))
    code = main(["generate", path, "--input-ids", ids, "--max-new-tokens", "8", "--dtype", "float32", *options])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "tokens in" in err
    return [[int(t) for t in line.split()] for line in out.splitlines()]


def upstream_new_tokens(upstream: transformers.PreTrainedModel, **kwargs: object) -> list[list[int]]:
    out = upstream.generate(torch.tensor([PROMPT]), max_new_tokens=8, pad_token_id=0, **kwargs)
    return out[:, len(PROMPT) :].tolist()


def test_num_beams_prints_the_best_beams(capsys: pytest.CaptureFixture[str], checkpoint: tuple) -> None:
    path, upstream = checkpoint
    printed = printed_sequences(capsys, path, "--num-beams", "3", "--num-return-sequences", "2")
    assert printed == upstream_new_tokens(upstream, num_beams=3, num_return_sequences=2)


def test_prompt_lookup_prints_greedy_tokens(capsys: pytest.CaptureFixture[str], checkpoint: tuple) -> None:
    path, upstream = checkpoint
    assert printed_sequences(capsys, path, "--prompt-lookup", "3") == upstream_new_tokens(upstream)


def test_sampled_sequences_one_line_each(capsys: pytest.CaptureFixture[str], checkpoint: tuple) -> None:
    path, _ = checkpoint
    printed = printed_sequences(capsys, path, "--sample", "--temperature", "2.0", "--num-return-sequences", "3")
    assert len(printed) == 3 and all(len(row) == 8 for row in printed)
    assert len({tuple(row) for row in printed}) > 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--num-return-sequences", "2"], "Greedy methods"),
        (["--num-beams", "2", "--num-return-sequences", "3"], "smaller or equal to `num_beams`"),
        (["--num-beams", "2", "--sample"], "beam sampling"),
        (["--num-beams", "0"], "--num-beams"),
    ],
)
def test_decoding_flag_errors(
    capsys: pytest.CaptureFixture[str], checkpoint: tuple, options: list[str], message: str
) -> None:
    path, _ = checkpoint
    code = main(["generate", path, "--input-ids", "1,2", *options])
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err


def test_assistant_streams_greedy_tokens(capsys: pytest.CaptureFixture[str], checkpoint: tuple, tmp_path) -> None:
    path, upstream = checkpoint
    torch.manual_seed(1)
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    options = ("--assistant", str(tmp_path), "--num-assistant-tokens", "3")
    assert printed_sequences(capsys, path, *options) == upstream_new_tokens(upstream)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--prompt-lookup", "2", "--num-beams", "2"], "num_beams > 1 with prompt_lookup_num_tokens"),
        (["--num-assistant-tokens", "2"], "--num-assistant-tokens only applies with --assistant"),
    ],
)
def test_candidate_decoding_refusals_are_usage_errors(
    capsys: pytest.CaptureFixture[str], checkpoint: tuple, options: list[str], message: str
) -> None:
    path, _ = checkpoint
    code = main(["generate", path, "--input-ids", "1,2", *options])
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err


def test_an_assistant_with_another_vocabulary_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], checkpoint: tuple, tmp_path
) -> None:
    path, _ = checkpoint
    config = transformers.LlamaConfig(
        vocab_size=80, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    code = main(["generate", path, "--input-ids", "1,2", "--assistant", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2
    assert "vocab_size (80) differs from the model's (64)" in err
