"""attnlab.tasks.choice: the harness's prompt, its tokenisation and its scores, checked on strings
and numbers worked out by hand; the demonstrations never include the scored question."""

import json
import random
import re

import pytest

from attnlab.errors import BadInput
from attnlab.tasks.choice import (
    DemoPool,
    Example,
    argmax,
    build_prompt,
    continuations,
    encode_choices,
    encode_pair,
    judge,
    mean_stderr,
    read_examples,
)
from attnlab.tokenizers import Tokenizer


class Pieces(Tokenizer):
    """A word tokenizer that keeps each word's leading whitespace on it, as GPT-2's byte-level
    BPE does ("Answer: B" -> "Answer:", " B"); ids are handed out as pieces are first seen."""

    def __init__(self, pattern=r"\s*\S+|\s+"):
        self.pattern = pattern
        self.pieces = ["<bos>"]
        self.pad_id = self.unk_id = None
        self.bos_id = self.eos_id = 0

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def encode(self, text, add_bos=False, add_eos=False):
        assert not add_bos and not add_eos  # the harness's pair encoding adds neither
        ids = []
        for p in re.findall(self.pattern, text):
            if p not in self.pieces:
                self.pieces.append(p)
            ids.append(self.pieces.index(p))
        return ids

    def decode(self, ids, skip_special=True):
        return "".join(self.pieces[i] for i in ids)

    def to_dict(self):
        return {"pieces": self.pieces}

    @classmethod
    def from_dict(cls, data):
        raise NotImplementedError

    def show(self, ids):
        return [self.pieces[i] for i in ids]


# --- the prompt ------------------------------------------------------------------------------
QUESTION = Example("Q: 2+2? A:", ("3", "4"), 1, "Answer the question.")
DEMOS = [Example("Q: 1+1? A:", ("2", "5"), 0), Example("Q: 3+3? A:", ("7", "6"), 1, "ignored")]


def test_the_prompt_is_description_demonstrations_context():
    assert build_prompt(QUESTION, DEMOS) == ("Answer the question.\n\n"
                                             "Q: 1+1? A: 2\n\n"
                                             "Q: 3+3? A: 6\n\n"
                                             "Q: 2+2? A:")
    assert continuations(QUESTION) == [" 3", " 4"]


def test_zero_shot_and_no_instruction():
    assert build_prompt(QUESTION) == "Answer the question.\n\nQ: 2+2? A:"
    plain = Example("The sky is", ("blue", "green"), 0)
    assert build_prompt(plain) == "The sky is"
    assert build_prompt(plain, DEMOS[:1]) == "Q: 1+1? A: 2\n\nThe sky is"
    assert build_prompt(Example("x", ("a", "b"), 0, "")) == "x"  # an empty instruction: none


# --- encode_pair -----------------------------------------------------------------------------
def test_the_continuation_is_what_the_whole_adds_after_the_context():
    tok = Pieces()
    ctx, cont = encode_pair(tok, "Q: 2+2? A:", " 4")
    assert tok.show(ctx) == ["Q:", " 2+2?", " A:"] and tok.show(cont) == [" 4"]


def test_trailing_whitespace_moves_onto_the_continuation():
    """"A: " + "4" encodes as "A:" + " 4"; without the move the space would be a piece of its
    own at the end of the context."""
    tok = Pieces()
    assert tok.show(tok.encode("Q: 2+2? A: ")) == ["Q:", " 2+2?", " A:", " "]
    ctx, cont = encode_pair(tok, "Q: 2+2? A: ", "4")
    assert tok.show(ctx) == ["Q:", " 2+2?", " A:"] and tok.show(cont) == [" 4"]
    ctx, cont = encode_pair(tok, "line one\n\n", "next")  # any whitespace, not only spaces
    assert tok.show(ctx) == ["line", " one"] and tok.show(cont) == ["\n\nnext"]


def test_a_merge_across_the_boundary_is_split_by_length_as_the_harness_does():
    """"foo" + "bar" encodes as one piece "foobar": the context's one id is cut off the whole,
    and nothing is left for the continuation."""
    tok = Pieces()
    assert encode_pair(tok, "foo", "bar") == (tok.encode("foo"), [])
    trailing = Pieces(r"\S+\s*|\s+")  # whitespace sticks to the word before it
    with pytest.raises(BadInput, match=r"data.jsonl:3: choice 1 \(' '\) encodes to no token"):
        encode_choices(trailing, "foo", Example("foo", ("a", " "), 0), "data.jsonl:3")


def test_an_empty_context_is_the_bos_token():
    tok = Pieces()
    assert encode_pair(tok, "", " blue sky") == ([0], tok.encode(" blue sky"))
    assert encode_pair(tok, "  ", "blue") == ([0], tok.encode("  blue"))  # whitespace only
    tok.bos_id = tok.encode(" blue")[0]  # the continuation starts with that id: it is the context
    assert encode_pair(tok, "", " blue sky") == (tok.encode(" blue"), tok.encode(" sky"))
    tok.bos_id = tok.eos_id = None
    with pytest.raises(BadInput, match="neither a BOS nor an EOS"):
        encode_pair(tok, "", " blue")


def test_encode_choices_gives_one_request_per_choice_with_one_context():
    tok = Pieces()
    requests = encode_choices(tok, build_prompt(QUESTION, DEMOS), QUESTION)
    assert len(requests) == 2 and requests[0][0] == requests[1][0]
    assert [tok.show(c) for _, c in requests] == [[" 3"], [" 4"]]
    assert tok.decode(requests[0][0]) == build_prompt(QUESTION, DEMOS)


# --- scores ----------------------------------------------------------------------------------
def test_acc_and_acc_norm_on_hand_made_scores():
    ex = Example("c", ("a", "bbbb", "cc"), 1)
    j = judge(ex, [-2.0, -4.0, -6.0])  # per character: -2, -1, -3
    assert (j.pred, j.pred_norm, j.acc, j.acc_norm) == (0, 1, 0.0, 1.0)
    j = judge(Example("c", ("a", "bbbb", "cc"), 0), [-2.0, -4.0, -6.0])
    assert (j.acc, j.acc_norm) == (1.0, 0.0)


def test_acc_norm_divides_by_the_choice_not_by_the_continuation():
    """Scores on which the two rules disagree: per character of "a" and "bb", -1.1 < -1.0
    (choice 1 wins); per character of " a" and " bb", -0.55 > -0.67 (choice 0 would)."""
    j = judge(Example("c", ("a", "bb"), 1), [-1.1, -2.0])
    assert j.pred_norm == 1 and j.pred == 0
    assert -1.1 / len(" a") > -2.0 / len(" bb")


def test_ties_go_to_the_first_as_numpy_argmax():
    assert argmax([1.0, 3.0, 3.0, 2.0]) == 1 and argmax([5.0]) == 0
    assert judge(Example("c", ("ab", "cd"), 1), [-1.0, -1.0]).pred == 0


def test_mean_and_the_harness_standard_error():
    assert mean_stderr([1.0, 0.0, 1.0, 1.0]) == (0.75, 0.25)  # sample std 0.5, over √4
    assert mean_stderr([1.0]) == (1.0, None)


def test_judge_needs_a_score_per_choice():
    with pytest.raises(BadInput, match="2 scores for 3 choices"):
        judge(Example("c", ("a", "b", "c"), 0), [0.0, 1.0])


# --- demonstrations --------------------------------------------------------------------------
def pool_with_copies() -> list[Example]:
    """Twelve questions; 0, 4 and 9 are the same question, and so are 2 and 7."""
    rows = [Example(f"q{i}", ("a", "b"), i % 2) for i in range(12)]
    rows[4] = rows[9] = Example("q0", ("a", "b"), 0)
    rows[7] = Example("q2", ("a", "b"), 0)
    return rows


def test_demonstrations_never_include_the_question_or_a_copy_of_it():
    rows = pool_with_copies()
    pool = DemoPool(rows, is_data=True)
    for position, example in enumerate(rows):
        copies = {j for j, other in enumerate(rows) if other == example}
        assert pool.excluded(example, position) == copies | {position}
        assert pool.available(example, position) == len(rows) - len(copies)
        for seed in [*range(40), None]:
            for shots in (1, 3, pool.available(example, position)):
                picked = pool.draw(example, position, shots, seed)
                assert len(picked) == shots == len(set(picked))
                assert all(j != position and rows[j] != example for j in picked)


def test_random_draws_are_uniform_over_the_others():
    """Every other line is drawn about equally often: the copies left out of the sample do not
    tilt it towards any line."""
    rows = pool_with_copies()
    pool = DemoPool(rows, is_data=True)
    counts = dict.fromkeys(range(12), 0)
    for seed in range(3000):
        for j in pool.draw(rows[0], 0, 2, seed):
            counts[j] += 1
    drawn = {j: n for j, n in counts.items() if n}
    assert set(drawn) == {1, 2, 3, 5, 6, 7, 8, 10, 11}  # never 0, 4 or 9 (the same question)
    assert all(abs(n / 6000 - 1 / 9) < 0.02 for n in drawn.values()), drawn


def test_a_separate_pool_excludes_copies_of_the_question_only():
    pool = DemoPool(pool_with_copies())
    question = Example("q0", ("a", "b"), 0)
    assert pool.excluded(question, 3) == {0, 4, 9}  # not line 3: the question is not from here
    assert pool.draw(question, 3, 9, None) == [1, 2, 3, 5, 6, 7, 8, 10, 11]
    other = Example("q0", ("a", "b"), 1)  # the same context with another answer: not a copy
    assert pool.excluded(other, 0) == set() and pool.available(other, 0) == 12


def test_the_same_seed_draws_the_same_demonstrations():
    pool = DemoPool([Example(f"q{i}", ("a", "b"), 0) for i in range(50)])
    question = Example("new", ("a", "b"), 0)
    draws = {seed: [pool.draw(question, p, 5, seed) for p in range(20)] for seed in (0, 1)}
    assert draws[0] == [pool.draw(question, p, 5, 0) for p in range(20)]
    assert draws[0] != draws[1]
    assert len({tuple(d) for d in draws[0]}) > 1  # each question has its own draw
    # the documented draw: nothing excluded, so it is random.Random("SEED:POSITION").sample
    assert draws[1][3] == random.Random("1:3").sample(range(50), 5)


def test_first_order_takes_the_first_k_for_every_question():
    rows = [Example(f"q{i}", ("a", "b"), 0) for i in range(6)]
    pool = DemoPool(rows, is_data=True)
    assert pool.draw(rows[4], 4, 2, None) == pool.draw(rows[5], 5, 2, None) == [0, 1]
    assert pool.draw(rows[0], 0, 2, None) == [1, 2]  # its own line skipped


def test_more_shots_than_the_pool_holds_is_an_error_with_the_numbers():
    rows = pool_with_copies()
    pool = DemoPool(rows, is_data=True)
    with pytest.raises(BadInput, match="10 demonstrations asked for, but only 9 to draw from"):
        pool.draw(rows[0], 0, 10, 0)
    with pytest.raises(BadInput, match=">= 0"):
        pool.draw(rows[0], 0, -1, 0)
    assert pool.draw(rows[0], 0, 0, 0) == []


# --- reading ---------------------------------------------------------------------------------
def write(tmp_path, *lines: str):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_read_examples(tmp_path):
    path = write(tmp_path, json.dumps({"context": "a\u2028b", "choices": ["x", "y"], "answer": 1,
                                       "id": 7}, ensure_ascii=False),
                 "",
                 json.dumps({"context": "", "choices": ["u", "v", "w"], "answer": 0,
                             "instruction": "Pick."}),
                 json.dumps({"context": "c", "choices": ["u", "v"], "answer": 1,
                             "instruction": None}))  # null: no instruction
    examples = read_examples(path)
    assert examples == [Example("a\u2028b", ("x", "y"), 1),
                        Example("", ("u", "v", "w"), 0, "Pick."), Example("c", ("u", "v"), 1)]
    assert [e.line for e in examples] == [1, 3, 4]


GOOD = {"context": "c", "choices": ["x", "y"], "answer": 0}


@pytest.mark.parametrize("change, message", [
    ({"answer": 2}, "'answer' is 2, outside the 2 choices (0..1)"),
    ({"answer": -1}, "'answer' is -1, outside"),
    ({"answer": True}, "'answer' must be the index of a choice, got bool True"),
    ({"answer": "0"}, "'answer' must be the index of a choice, got str '0'"),
    ({"answer": 1.0}, "'answer' must be the index of a choice, got float"),
    ({"choices": ["x", ""]}, "choice 1 is an empty string"),
    ({"choices": ["x"]}, "'choices' holds 1; a question needs at least 2"),
    ({"choices": "xy"}, "'choices' must be a list of strings"),
    ({"choices": ["x", 3]}, "'choices' must be a list of strings"),
    ({"context": None}, "'context' must be a string, got NoneType"),
    ({"instruction": 5}, "'instruction' must be a string"),
    ({"context": ...}, "field 'context' missing"),
    ({"answer": ...}, "field 'answer' missing"),
])
def test_a_bad_line_is_one_error_naming_file_line_and_field(tmp_path, change, message):
    row = {k: v for k, v in {**GOOD, **change}.items() if v is not ...}
    path = write(tmp_path, json.dumps(GOOD), json.dumps(row))
    with pytest.raises(BadInput, match=re.escape(f"{path}:2: {message}")):
        read_examples(path)


def test_bad_json_an_empty_file_and_a_missing_file(tmp_path):
    with pytest.raises(BadInput, match=re.escape(f"{tmp_path / 'data.jsonl'}:2: invalid JSON")):
        read_examples(write(tmp_path, json.dumps(GOOD), "{not json"))
    with pytest.raises(BadInput, match="expected a JSON object"):
        read_examples(write(tmp_path, "[1, 2]"))
    with pytest.raises(BadInput, match="no examples"):
        read_examples(write(tmp_path, "", "  "))
    with pytest.raises(FileNotFoundError, match="nothing.jsonl"):
        read_examples(tmp_path / "nothing.jsonl")
