"""attnlab.generation.likelihood against the definition, computed the slow way: one full
forward pass over each (context + continuation) alone, log-softmax, the continuation's tokens
picked and summed. The batched path (shared prefix once, a KV cache copied per choice, right
padding) must give the same numbers."""

import pytest
import torch

from attnlab import GPT, ModelConfig
from attnlab.errors import BadInput
from attnlab.generation.likelihood import (
    continuation_logprobs,
    grouped_continuation_logprobs,
    rolling_nll,
    token_logprobs,
    windows,
)

TINY = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_decoder_layers=2, max_len=64)


def tiny(preset: str, **fields) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig.from_preset(preset, **{**TINY, **fields})).eval()


# learned positions; RoPE + GQA; and that with a sliding window of 4 (Mistral)
@pytest.fixture(scope="module", params=["gpt-mini", "llama-mini", "mistral-like"])
def model(request) -> GPT:
    if request.param == "mistral-like":
        return tiny("llama-mini", num_kv_heads=2, sliding_window=4)
    return tiny(request.param, **({"num_kv_heads": 2} if request.param == "llama-mini" else {}))


def direct(model: GPT, context: list[int], continuation: list[int],
           window: int | None = None) -> float:
    """The harness's definition, one sequence at a time: the input is (context ⧺ continuation)
    cut to its last window + 1 tokens, less the last; its last len(continuation) positions
    predict the continuation."""
    whole = context + continuation
    if window is not None:
        whole = whole[-(window + 1):]
    with torch.no_grad():
        logits = model(torch.tensor([whole[:-1]]))[0, -len(continuation):]
    logp = torch.log_softmax(logits.double(), -1)
    return float(sum(logp[t, tok] for t, tok in enumerate(continuation)))


def check(model, requests, window=None):
    got = continuation_logprobs(model, requests, window)
    assert got.dtype == torch.float32 and got.shape == (len(requests),)
    want = torch.tensor([direct(model, x, c, window) for x, c in requests])
    torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_choices_of_different_lengths_sharing_a_context(model):
    context = [5, 17, 3, 42, 8, 8, 1]
    check(model, [(context, [9]), (context, [11, 12, 13, 14, 15]), (context, [20, 21])])


def test_choices_that_share_their_first_tokens(model):
    """The common prefix then reaches past the context ("the cat" / "the dog")."""
    context = [4, 4, 30]
    check(model, [(context, [7, 8, 9]), (context, [7, 8, 2, 2]), (context, [7, 10])])


def test_single_token_choices_and_a_one_token_context(model):
    check(model, [([3], [1]), ([3], [2]), ([3], [49])])


def test_identical_choices_score_the_same(model):
    got = continuation_logprobs(model, [([1, 2, 3], [4, 5]), ([1, 2, 3], [4, 5])])
    assert got[0] == got[1]


def test_different_contexts_in_one_call(model):
    """Requests need not share anything: with no common prefix the batch runs uncached."""
    check(model, [([1, 2, 3], [4, 5]), ([6, 7], [8]), ([1, 2], [9, 9, 9])])


@pytest.mark.parametrize("window", [6, 9])
def test_a_window_shorter_than_the_prompt_cuts_from_the_left_per_choice(model, window):
    """As the harness: each choice keeps the last window + 1 tokens of its own sequence, so
    choices of different lengths see different context (and share less, or nothing)."""
    context = list(range(1, 13))
    check(model, [(context, [20]), (context, [21, 22, 23]), (context, [24, 25])], window)


def test_the_window_defaults_to_the_models_context():
    short = tiny("gpt-mini", max_len=64, block_size=8)
    context = list(range(1, 20))
    requests = [(context, [30, 31]), (context, [32])]
    want = torch.tensor([direct(short, x, c, window=8) for x, c in requests])
    torch.testing.assert_close(continuation_logprobs(short, requests).double(), want.double(),
                               atol=1e-5, rtol=1e-5)


def test_a_question_costs_two_forward_calls_whatever_its_choices(model):
    calls = []
    hook = model.blocks.register_forward_hook(  # the stack: (batch, seq, d_model) in
        lambda m, args, out: calls.append(tuple(args[0].shape[:2])))
    try:
        context = list(range(1, 30))
        continuation_logprobs(model, [(context, [5, 6, 7]), (context, [8]), (context, [9, 9])])
        assert calls == [(1, 29), (3, 2)]  # the shared prefix, then the rest as one batch
        calls.clear()
        continuation_logprobs(model, [(context, [5]), (context, [8]), (context, [9])])
        assert calls == [(1, 29)]  # one-token choices: the prefix's states are all it needs
    finally:
        hook.remove()


QUESTIONS = [
    [([5, 17, 3, 42, 8, 8, 1], [9]), ([5, 17, 3, 42, 8, 8, 1], [11, 12, 13])],
    [([2], [7, 8]), ([2], [7, 10, 11, 12]), ([2], [30])],  # a one-token prefix
    [(list(range(1, 20)), [21, 22]), (list(range(1, 20)), [23])],  # the longest prefix
    [([4, 4], [6])],  # a single request: its whole input is the prefix
]


def test_only_the_read_positions_go_through_the_vocabulary_projection(model):
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape))
    try:
        context = list(range(1, 30))
        continuation_logprobs(model, [(context, [5, 6, 7]), (context, [8]), (context, [9, 9])])
    finally:
        hook.remove()
    assert rows == [(3 + 1 + 2, model.config.d_model)]  # one per continuation token


# 30 tokens every question starts with (pinned demonstrations)
DEMOS = [3 + i % 40 for i in range(30)]
PINNED = [
    [(DEMOS + [5, 17, 3], [9]), (DEMOS + [5, 17, 3], [11, 12, 13])],
    [(DEMOS + [2], [7, 8]), (DEMOS + [2], [30])],
    [(DEMOS + list(range(1, 9)), [21, 22]), (DEMOS + list(range(1, 9)), [23])],
]


def test_a_prefix_common_to_the_whole_batch_runs_once(model):
    """K pinned demonstrations: the batch's common tokens run once, (1, 30), then each
    question's own prefix (left-padded between the common part and its own tokens), then the
    rests; every score is what the question gives alone."""
    calls = []
    hook = model.blocks.register_forward_hook(
        lambda m, args, out: calls.append(tuple(args[0].shape[:2])))
    try:
        got = grouped_continuation_logprobs(model, PINNED)
    finally:
        hook.remove()
    assert calls == [(1, 30), (3, 8), (6, 2)]
    for scores, requests in zip(got, PINNED, strict=True):
        want = torch.tensor([direct(model, x, c) for x, c in requests])
        torch.testing.assert_close(scores.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_a_continuation_read_from_the_common_part(model):
    """Two questions with the same context: the first continuation token of every request is
    predicted by the last common state."""
    context = list(range(1, 13))
    questions = [[(context, [5]), (context, [6, 7])], [(context, [8, 9]), (context, [10])]]
    got = grouped_continuation_logprobs(model, questions)
    for scores, requests in zip(got, questions, strict=True):
        want = torch.tensor([direct(model, x, c) for x, c in requests])
        torch.testing.assert_close(scores.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_several_questions_in_one_batch_score_as_each_alone(model):
    """Prefixes of different lengths are left-padded, rests right-padded: nothing changes."""
    calls = []
    hook = model.blocks.register_forward_hook(  # the stack: (batch, seq, d_model) in
        lambda m, args, out: calls.append(tuple(args[0].shape[:2])))
    try:
        got = grouped_continuation_logprobs(model, QUESTIONS)
    finally:
        hook.remove()
    assert calls == [(4, 19), (8, 3)]  # every prefix, then every rest: two calls in all
    for scores, requests in zip(got, QUESTIONS, strict=True):
        want = torch.tensor([direct(model, x, c) for x, c in requests])
        torch.testing.assert_close(scores.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_a_batch_wider_than_the_window_is_split(model):
    """Window 12: the second question's 11-token prefix and the first's 5-token rest would
    make 16 columns; each question alone fits (and the first is cut from the left)."""
    groups = [[(list(range(1, 10)), [30, 31, 32, 33, 34]), (list(range(1, 10)), [35])],
              [(list(range(1, 12)), [36]), (list(range(1, 12)), [37])]]
    got = grouped_continuation_logprobs(model, groups, window=12)
    for scores, requests in zip(got, groups, strict=True):
        want = torch.tensor([direct(model, x, c, window=12) for x, c in requests])
        torch.testing.assert_close(scores.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_a_question_cut_differently_per_choice_shares_no_prefix_in_a_batch(model):
    groups = [[(list(range(1, 13)), [20]), (list(range(1, 13)), [21, 22, 23])],  # cut at 6
              [([3, 4], [5, 6])]]
    got = grouped_continuation_logprobs(model, groups, window=6)
    for scores, requests in zip(got, groups, strict=True):
        want = torch.tensor([direct(model, x, c, window=6) for x, c in requests])
        torch.testing.assert_close(scores.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_token_logprobs_is_the_per_token_definition(model):
    ids = torch.tensor([[1, 5, 9, 2, 7, 7], [3, 3, 4, 10, 11, 12]])
    got = token_logprobs(model, ids)
    assert got.shape == (2, 5) and got.dtype == torch.float32
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).double(), -1)
    want = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    # the sum over a continuation's tokens is continuation_logprobs' score
    score = continuation_logprobs(model, [([1, 5, 9], [2, 7, 7])])[0]
    torch.testing.assert_close(got[0, 2:].sum(), score, atol=1e-5, rtol=1e-5)


def test_bf16_logits_are_scored_in_float32():
    m = tiny("gpt-mini").to(torch.bfloat16)
    got = continuation_logprobs(m, [([1, 2, 3], [4, 5]), ([1, 2, 3], [6])])
    assert got.dtype == torch.float32 and torch.isfinite(got).all()


def test_an_empty_group_is_refused(model):
    with pytest.raises(BadInput, match="nothing to score"):
        grouped_continuation_logprobs(model, [[([1], [2])], []])


@pytest.mark.parametrize("requests, message", [
    ([], "nothing to score"),
    ([([], [1])], "context"),
    ([([1], [])], "continuation"),
])
def test_empty_input_is_refused(model, requests, message):
    with pytest.raises(BadInput, match=message):
        continuation_logprobs(model, requests)


def test_a_continuation_longer_than_the_window_is_refused(model):
    with pytest.raises(BadInput, match="does not fit"):
        continuation_logprobs(model, [([1, 2], [3, 4, 5, 6])], window=3)


# --- perplexity through a sliding window -----------------------------------------------------
@pytest.mark.parametrize("n, block, stride", [(10, 4, 2), (10, 4, 3), (11, 4, 3), (2, 4, 2),
                                              (40, 64, 32), (33, 8, 1), (9, 2, 1)])
def test_windows_score_every_token_but_the_first_once(n, block, stride):
    spans = windows(n, block, stride)
    scored = [t for _, e, f in spans for t in range(f, e)]
    assert scored == list(range(1, n))  # each once, in order
    assert spans[-1][1] == n
    for i, (b, e, f) in enumerate(spans):
        assert 0 < e - b <= block and b < f <= e
        assert b == i * stride  # a window starts every stride tokens
        if i:  # after the first window, at least block − stride tokens of context
            assert f - b >= block - stride


def test_windows_as_worked_by_hand():
    # 10 tokens, windows of 4 every 2: [0,4) scores 1..3, [2,6) 4..5, [4,8) 6..7, [6,10) 8..9
    assert windows(10, 4, 2) == [(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)]


@pytest.mark.parametrize("block, stride, batch", [(64, 63, 1), (16, 8, 1), (16, 8, 3),
                                                  (16, 5, 2), (16, 15, 2)])
def test_rolling_nll_equals_each_window_run_alone(model, block, stride, batch):
    """Σ −log p over every window's scored tokens, each window its own full forward pass."""
    torch.manual_seed(1)
    ids = torch.randint(4, 50, (45,))
    expected = 0.0
    for b, e, f in windows(len(ids), block, stride):
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[None, b:e]).double(), -1)[0]
        expected -= float(sum(logp[t - b - 1, ids[t]] for t in range(f, e)))
    nll, n = rolling_nll(model, ids, block, stride, batch)
    assert n == len(ids) - 1
    assert nll == pytest.approx(expected, rel=1e-5)


def test_rolling_nll_with_one_window_is_token_logprobs(model):
    ids = torch.randint(4, 50, (1, 30), generator=torch.Generator().manual_seed(2))
    nll, n = rolling_nll(model, ids[0], block=64, stride=32)
    assert n == 29 and nll == pytest.approx(-float(token_logprobs(model, ids).sum()), rel=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(ids=[5], block=8, stride=4), "at least 2 tokens"),
    (dict(ids=[5, 6, 7], block=1, stride=1), "block >= 2"),
    (dict(ids=[5, 6, 7], block=8, stride=8), "stride < block"),
    (dict(ids=[5, 6, 7], block=8, stride=4, batch=0), "batch must be >= 1"),
])
def test_rolling_nll_bad_arguments(model, kwargs, message):
    with pytest.raises(BadInput, match=message):
        rolling_nll(model, **kwargs)
