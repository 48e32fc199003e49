"""One beam search for both architectures, token for token transformers' ``generate``.

GPT-2, Llama, Marian and T5: tiny random transformers models saved to a folder and loaded into
attnlab (as tests/interop/test_hf_*.py build them). Each family's end token is picked among the
tokens its greedy text reaches, so that hypotheses end at different lengths and the length
penalty decides between finished and running ones. transformers runs with
``early_stopping=True`` (attnlab's stopping rule), ``length_penalty=α`` and attnlab's rule for
encoder–decoders that pad is never a word of the output (:class:`NeverPad`)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import transformers
from transformers.generation import LogitsProcessor, LogitsProcessorList

from attnlab import from_pretrained
from attnlab.generation.beam import beam_generate, beam_search, length_penalty
from attnlab.generation.decode import generate
from attnlab.generation.seq2seq import greedy_decode

DECODERS = {
    # initializer_range 0.2: at GPT-2's 0.02 a random model repeats one token forever
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=300, n_embd=64, n_head=4, n_layer=3, n_positions=128, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=172, num_hidden_layers=3, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=False)),
}
MARIAN_PAD, T5_PAD = 59, 0
SEQ2SEQ = {
    "marian": lambda: transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=3,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
        decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=MARIAN_PAD,
        decoder_start_token_id=MARIAN_PAD, eos_token_id=0, forced_eos_token_id=None,
        activation_function="swish", scale_embedding=True)),
    "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=12,
        dropout_rate=0.0, feed_forward_proj="relu", pad_token_id=T5_PAD, eos_token_id=1,
        decoder_start_token_id=T5_PAD)),
}
PAD = {"marian": MARIAN_PAD, "t5": T5_PAD}
NEW = 12  # tokens generated at most (encoder–decoders: max_length NEW + 1, the start included)
SEARCHES = [(1, 1.0), (2, 0.5), (4, 1.0), (4, 2.0)]  # (beams, α); 1 is greedy


def randomised(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """Non-trivial norms and biases (so that copying them is tested), the matrices ``scale``
    times their initialisation (T5 at its own repeats a token)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
            elif "shared" not in name and "relative" not in name and "embed_positions" not in name:
                p.mul_(scale)
    return model.eval()


def noisy(marian: torch.nn.Module) -> torch.nn.Module:
    """Marian with noise on every weight and its output bias (tests/interop/test_hf_marian.py):
    scaled, its post-norm layers keep the text they give."""
    with torch.no_grad():
        for name, p in marian.named_parameters():
            if "embed_positions" not in name:  # a fixed table, not stored in the file
                p.add_(torch.randn_like(p) * 0.3)
        marian.final_logits_bias.normal_(std=0.3)
    return marian.eval()


def reachable_end(texts: torch.Tensor, avoid: set[int]) -> int:
    """The token found in most rows of ``texts (batch, n)`` (ties: the earliest on average),
    as the end token: eos then ends some hypotheses, at different steps."""
    rows, first = Counter(), Counter()  # rows holding a token; the sum of its first positions
    for row in texts.tolist():
        for token in set(row) - avoid:
            rows[token] += 1
            first[token] += row.index(token)
    return max(rows, key=lambda t: (rows[t], -first[t] / rows[t], -t))


class NeverPad(LogitsProcessor):
    """attnlab's rule for encoder–decoders: pad is never emitted, and the log-probabilities
    are those of the other tokens (normalised without pad)."""

    def __init__(self, pad: int):
        self.pad = pad

    def __call__(self, input_ids, scores):
        return scores.index_fill(-1, torch.tensor([self.pad]), float("-inf")).log_softmax(-1)


@pytest.fixture(scope="module", params=["gpt2", "llama", "marian", "t5"])
def family(request, tmp_path_factory):
    """``(kind, theirs, ours, inputs, eos)``: the transformers model with its end token set,
    attnlab's load of its folder, and the batch (a left-padded prompt batch and its mask, or
    padded sources)."""
    kind = request.param
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    if kind in DECODERS:
        theirs = randomised(DECODERS[kind](), 1.0)
        prompt = torch.randint(1, 300, (3, 6), generator=g)
        mask = torch.ones_like(prompt)
        prompt[1, :2], mask[1, :2] = 0, 0  # the second prompt is 4 tokens, left-padded
        inputs = (prompt, mask)
        theirs.generation_config.eos_token_id = None
        probe = theirs.generate(prompt, attention_mask=mask, max_new_tokens=NEW,
                                do_sample=False, pad_token_id=0)[:, 6:]
        eos = reachable_end(probe[:, 1:], {0})
        theirs.config.eos_token_id = theirs.generation_config.eos_token_id = eos
        theirs.config.bos_token_id = theirs.generation_config.bos_token_id = 0
    else:
        pad = PAD[kind]
        theirs = randomised(SEQ2SEQ[kind](), 3.0) if kind == "t5" else noisy(SEQ2SEQ[kind]())
        vocab = theirs.config.vocab_size
        src = torch.randint(1, vocab, (4, 9), generator=g)
        src[src == pad] = 2
        src[1, 6:], src[2, 4:] = pad, pad  # padded sources
        inputs = (src,)
        theirs.generation_config.eos_token_id = None
        probe = hf_seq2seq(theirs, src, pad, num_beams=1, max_length=NEW + 1)[:, 1:]
        eos = reachable_end(probe[:, 1:], {pad})
        theirs.config.eos_token_id = theirs.generation_config.eos_token_id = eos
    folder = tmp_path_factory.mktemp(kind)
    theirs.save_pretrained(folder)
    ours = from_pretrained(folder).eval()
    if kind not in DECODERS:
        assert ours.config.eos_id == eos and ours.config.pad_id == PAD[kind]
    return kind, theirs, ours, inputs, eos


def hf_seq2seq(theirs, src, pad, **kwargs):
    # use_cache=False: transformers sizes T5's decoder cache by num_layers (the encoder's),
    # which fails when the decoder has more layers; attnlab's side decodes with its cache
    return theirs.generate(src, attention_mask=(src != pad).long(), do_sample=False,
                           use_cache=False,
                           logits_processor=LogitsProcessorList([NeverPad(pad)]), **kwargs)


def theirs_and_ours(family, beams: int, alpha: float):
    """transformers' and attnlab's answers, each row to its first eos after the prompt (what
    follows is filler: pad there, eos or pad here)."""
    kind, theirs, ours, inputs, eos = family
    if kind in DECODERS:
        prompt, mask = inputs
        expected = theirs.generate(prompt, attention_mask=mask, max_new_tokens=NEW,
                                   do_sample=False, num_beams=beams, length_penalty=alpha,
                                   early_stopping=True, pad_token_id=0)
        got = beam_generate(ours, prompt, NEW, beams, alpha, eos_id=eos, attention_mask=mask)
        start = prompt.shape[1]
    else:
        (src,) = inputs
        expected = hf_seq2seq(theirs, src, PAD[kind], num_beams=beams, max_length=NEW + 1,
                              length_penalty=alpha, early_stopping=True)
        got = beam_search(ours, src, beams, alpha, max_len=NEW + 1, penalty="average")
        start = 1
    return [until_eos(r, start, eos) for r in expected.tolist()], \
        [until_eos(r, start, eos) for r in got.tolist()]


def until_eos(row: list[int], start: int, eos: int) -> list[int]:
    new = row[start:]
    return row[: start + new.index(eos) + 1] if eos in new else row


@pytest.mark.parametrize("beams,alpha", SEARCHES)
def test_beam_search_equals_transformers_generate(family, beams, alpha):
    expected, got = theirs_and_ours(family, beams, alpha)
    assert got == expected


def test_hypotheses_end_at_different_lengths(family):
    """The end token is reachable: some answers end early, at different lengths, so the
    comparisons above test finishing, the length penalty and the filler."""
    kind, *_, eos = family
    _, got = theirs_and_ours(family, 4, 1.0)
    start = 6 if kind in DECODERS else 1
    ended = [len(r) - start for r in got if r[-1] == eos]
    assert ended and min(ended) < NEW
    assert len({len(r) for r in got}) >= 2, got


def test_greedy_decoding_equals_transformers_greedy(family):
    """attnlab's greedy loops (``generate``, ``greedy_decode``) and a beam of one, against
    transformers' greedy search."""
    kind, _, ours, inputs, eos = family
    expected, from_beam = theirs_and_ours(family, 1, 1.0)
    assert from_beam == expected
    if kind in DECODERS:
        prompt, mask = inputs
        plain = generate(ours, prompt, NEW, attention_mask=mask, eos_id=eos)
        start = prompt.shape[1]
    else:
        plain = greedy_decode(ours, inputs[0], max_len=NEW + 1)
        start = 1
    assert [until_eos(r, start, eos) for r in plain.tolist()] == expected


@pytest.mark.parametrize("penalty,alpha", [("average", 1.0), ("gnmt", 0.6)])
def test_decoder_only_scores_are_normalised_log_probabilities(family, penalty, alpha):
    """The returned score is log P(answer | prompt), recomputed by one full pass over the
    answer, divided by the penalty of its length (eos included)."""
    kind, _, ours, inputs, eos = family
    if kind not in DECODERS:
        pytest.skip("the encoder–decoder's scores: tests/generation/test_beam.py")
    prompt, mask = inputs
    out, scores = beam_generate(ours, prompt, NEW, 3, alpha, penalty, eos_id=eos,
                                attention_mask=mask, return_scores=True)
    full_mask = torch.cat([mask, torch.ones_like(out[:, prompt.shape[1]:])], 1)
    with torch.no_grad():
        logp = ours(out, attention_mask=full_mask).log_softmax(-1)
    for row in range(len(out)):
        new = out[row, prompt.shape[1]:].tolist()
        n = new.index(eos) + 1 if eos in new else len(new)
        total = sum(logp[row, prompt.shape[1] - 1 + t, new[t]].item() for t in range(n))
        assert scores[row].item() == pytest.approx(total / length_penalty(n, alpha, penalty),
                                                   abs=1e-4)
