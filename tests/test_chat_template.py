"""apply_chat_template against upstream's: the same rendered prompt, ids and return types, the same jinja settings
(trim/lstrip blocks, loop controls, namespace, tojson, raise_exception, strftime_now) and the same sandbox."""

import pytest
import torch
import transformers

from transformers_static import AutoTokenizer

from . import tokenizer_fixtures as fixtures

CHAT = [
    {"role": "system", "content": "Be brief. Ünïcödé ok 🙂"},
    {"role": "user", "content": 'What is <b>2+2</b>? "quote" and 中文'},
    {"role": "assistant", "content": "4", "tool_calls": None},
    {"role": "user", "content": "  And 3+3?  "},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add ‘two’ numbers", "parameters": {}}}]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("chat")
    paths = {
        "chatml": fixtures.smollm_tokenizer(str(root / "chatml")),
        "llama2": fixtures.llama2_tokenizer(str(root / "llama2")),
        "features": fixtures.smollm_tokenizer(str(root / "features")),
    }
    loaded = {
        name: (transformers.AutoTokenizer.from_pretrained(p), AutoTokenizer.from_pretrained(p))
        for name, p in paths.items()
    }
    for tokenizer in loaded["features"]:
        tokenizer.chat_template = fixtures.FEATURE_TEMPLATE
    return loaded


def both(pair, conversation, **kwargs):
    theirs, ours = pair
    return theirs.apply_chat_template(conversation, **kwargs), ours.apply_chat_template(conversation, **kwargs)


@pytest.mark.parametrize("name", ["chatml", "llama2", "features"])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_rendered_text_and_ids_match_upstream(pairs, name, add_generation_prompt) -> None:
    pair = pairs[name]
    chat = CHAT if name != "llama2" else CHAT[:2]
    theirs, ours = both(pair, chat, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert ours == theirs
    theirs, ours = both(pair, chat, add_generation_prompt=add_generation_prompt)
    assert type(ours).__name__ == type(theirs).__name__ == "BatchEncoding"
    assert dict(ours) == dict(theirs)
    theirs, ours = both(pair, chat, add_generation_prompt=add_generation_prompt, return_dict=False)
    assert ours == theirs
    theirs, ours = both(pair, chat, add_generation_prompt=add_generation_prompt, return_tensors="pt")
    assert ours.keys() == theirs.keys()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0)


def test_batches_tools_kwargs_and_continuation_match_upstream(pairs) -> None:
    pair = pairs["features"]
    batch = [CHAT, CHAT[1:2]]
    theirs, ours = both(pair, batch, tokenize=False)
    assert ours == theirs and isinstance(ours, list)
    theirs, ours = both(pair, batch, padding=True, return_tensors="pt")
    torch.testing.assert_close(ours["input_ids"], theirs["input_ids"], rtol=0, atol=0)
    theirs, ours = both(pair, CHAT[:2], tools=TOOLS, tokenize=False)
    assert ours == theirs and "‘two’" in ours
    prefill = [*CHAT[:2], {"role": "assistant", "content": "The answer is"}]
    theirs, ours = both(pairs["chatml"], prefill, continue_final_message=True, tokenize=False)
    assert ours == theirs and ours.endswith("The answer is")
    theirs, ours = both(
        pairs["chatml"], CHAT[:2], tokenize=False, chat_template="{{ messages | length }} {{ x }}", x=7
    )
    assert ours == theirs == "2 7"
    theirs, ours = both(pairs["chatml"], CHAT, truncation=True, max_length=5, return_dict=False)
    assert ours == theirs and len(ours) == 5


def test_template_errors_match_upstream(pairs) -> None:
    import jinja2

    theirs, ours = pairs["llama2"]
    not_alternating = [CHAT[1], CHAT[1]]
    for tokenizer in (theirs, ours):
        with pytest.raises(jinja2.exceptions.TemplateError, match="Conversation roles must alternate"):
            tokenizer.apply_chat_template(not_alternating, tokenize=False)
        with pytest.raises(ValueError, match="empty conversation"):
            tokenizer.apply_chat_template([])
        with pytest.raises(ValueError, match="not compatible"):
            tokenizer.apply_chat_template(CHAT[1:2], add_generation_prompt=True, continue_final_message=True)
    escapes = [
        "{{ messages.__class__ }}",
        "{{ ''.__class__.__mro__ }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append(1) }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ (messages | first).update(role='x') }}",
    ]
    outcomes = [[_outcome(t, template) for t in (theirs, ours)] for template in escapes]
    assert [o[1] for o in outcomes] == [o[0] for o in outcomes]
    assert any(o[0].startswith("SecurityError") for o in outcomes)  # the sandbox refuses the namespace escape
    date = "{{ strftime_now('%Y') }}"
    assert ours.apply_chat_template(CHAT[1:2], chat_template=date, tokenize=False) == theirs.apply_chat_template(
        CHAT[1:2], chat_template=date, tokenize=False
    )


def _outcome(tokenizer, template: str) -> str:
    """What rendering gives: the text, or the exception's type and message."""
    try:
        return tokenizer.apply_chat_template(CHAT[1:2], chat_template=template, tokenize=False)
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def test_missing_template_and_unsupported_options(pairs, tmp_path) -> None:
    path = fixtures.gpt2_tokenizer(str(tmp_path / "plain"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    with pytest.raises(ValueError, match="chat_template is not set"):
        tokenizer.apply_chat_template(CHAT)
    _, ours = pairs["chatml"]
    with pytest.raises(NotImplementedError, match="return_assistant_tokens_mask"):
        ours.apply_chat_template(CHAT, return_assistant_tokens_mask=True)
    with pytest.raises(NotImplementedError, match="JSON-schema dicts"):
        ours.apply_chat_template(CHAT, tools=[len])
