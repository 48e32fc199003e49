"""attnlab.encoding, the old home of sentence embeddings, still imports for a release: with a
DeprecationWarning, and the same functions as attnlab.sentence_encoder."""

import importlib
import sys

import pytest

from attnlab import sentence_encoder


def test_the_old_module_warns_and_gives_the_same_functions(monkeypatch):
    monkeypatch.delitem(sys.modules, "attnlab.encoding", raising=False)
    with pytest.warns(DeprecationWarning, match="attnlab.sentence_encoder"):
        encoding = importlib.import_module("attnlab.encoding")
    assert encoding.load_encoder is sentence_encoder.load_encoder
    assert encoding.embed_sentences is sentence_encoder.embed_sentences
    assert encoding.SentenceEncoder is sentence_encoder.SentenceEncoder
    assert encoding.token_vectors is sentence_encoder.token_vectors
    assert encoding.minilm_path is sentence_encoder.minilm_path


def test_classify_texts_names_its_new_home(monkeypatch):
    monkeypatch.delitem(sys.modules, "attnlab.encoding", raising=False)
    with pytest.warns(DeprecationWarning):
        encoding = importlib.import_module("attnlab.encoding")
    with pytest.raises(AttributeError, match="attnlab.tasks.classify.classify_texts"):
        encoding.classify_texts  # noqa: B018
