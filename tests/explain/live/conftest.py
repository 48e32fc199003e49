"""Shared by the live explainer's tests: its sessions on small models, and the app served by
uvicorn on 127.0.0.1 on a free port, stopped afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.explain.live.app import create_app
from attnlab.explain.live.session import Session
from tests.app_thread import AppThread

MLM_TEXT = "the cat sat on the mat because it was warm\nthe dog sat on the rug\n" * 20


class LiveServer(AppThread):
    """``create_app(session, api_key)`` served on a thread; ``url`` ends without a slash."""

    def __init__(self, session: Session, api_key: str | None = None) -> None:
        self.session = session
        super().__init__(create_app(session, api_key))


@pytest.fixture(scope="session")
def decoder_session(char_lm) -> Session:
    """The trained character llama (tests/conftest.py): RoPE, grouped-query attention."""
    return Session(str(char_lm.folder), sentence="the quick brown fox")


@pytest.fixture(scope="session")
def mlm_folder(tmp_path_factory) -> Path:
    """A random bert-tiny masked LM with a WordPiece vocabulary, saved as a model folder."""
    from attnlab import ModelConfig, build_model
    from attnlab.storage import save_model_dir
    from attnlab.tokenizers import WordPieceTokenizer

    folder = tmp_path_factory.mktemp("mlm")
    corpus = folder / "corpus.txt"
    corpus.write_text(MLM_TEXT)
    tok = WordPieceTokenizer.train([corpus], vocab_size=60)
    config = ModelConfig.from_preset("bert-tiny", vocab_size=tok.vocab_size, max_len=32,
                                     head="mlm")
    torch.manual_seed(0)
    return save_model_dir(folder / "model", build_model(config).eval(), config,
                          {"text": tok.to_dict()})
