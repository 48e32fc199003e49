"""attnlab evaluate (sacreBLEU, chrF, speed) and training with a shared BPE vocabulary."""

from rouge_score.rouge_scorer import RougeScorer
from sacrebleu.metrics import BLEU, CHRF

from attnlab.cli import main
from attnlab.data import numbers_corpus
from attnlab.generation import translate
from attnlab.metrics import UnicodeWords
from attnlab.storage import load_model_dir
from attnlab.tokenizers import BPETokenizer
from tests.criteria import train_until


def test_shared_bpe_training_and_evaluate(tmp_path, capsys):
    train, test = numbers_corpus(3000, 40, seed=0)
    (tmp_path / "train.en").write_text("\n".join(s for s, _ in train) + "\n")
    (tmp_path / "train.de").write_text("\n".join(t for _, t in train) + "\n")
    (tmp_path / "test.en").write_text("\n".join(s for s, _ in test) + "\n")
    (tmp_path / "test.de").write_text("\n".join(t for _, t in test) + "\n")
    tok_path = tmp_path / "tokenizer.json"
    assert main(["tokenize", "train", "--vocab-size", "300", str(tmp_path / "train.en"),
                 str(tmp_path / "train.de"), "--out", str(tok_path)]) == 0
    run = tmp_path / "run"
    refs = [t for _, t in test]
    train_cmd = ["train", "translate", "--src", str(tmp_path / "train.en"), "--tgt",
                 str(tmp_path / "train.de"), "--tokenizer", str(tok_path), "--preset", "tiny",
                 "--warmup", "50", "--lr-factor", "2", "--max-tokens", "2048", "--out",
                 str(run), "--no-progress", "--no-evaluate"]
    steps = 0

    def hundred_steps():
        nonlocal steps
        steps += 100
        resume = ["--resume"] if steps > 100 else []
        assert main([*train_cmd, "--steps", str(steps), *resume]) == 0

    def speaks_german():  # greedy chrF on the test numbers; 200 steps gave 19.6 to 25.2
        model, _, toks = load_model_dir(run)
        hyps = translate(model, toks["source"], toks["target"], [s for s, _ in test])
        score = CHRF().corpus_score(hyps, [refs]).score
        return score > 20, f"chrF {score:.1f}"

    train_until(hundred_steps, speaks_german, "shared-BPE translation", every=1, cap=8,
                unit="rounds of 100 steps")
    model, config, toks = load_model_dir(run)
    assert config.tgt_vocab_size is None  # one vocabulary, one tied embedding matrix
    assert model.src_embed.weight is model.tgt_embed.weight is model.lm_head.weight
    assert toks["source"].encode("forty-two") == BPETokenizer.from_file(tok_path).encode(
        "forty-two")
    capsys.readouterr()

    hyp_path = tmp_path / "hyp.de"
    assert main(["evaluate", "translate", "--model", str(run), "--src", str(tmp_path / "test.en"),
                 "--ref", str(tmp_path / "test.de"), "--beam", "3", "--out", str(hyp_path),
                 "--lang", "de"]) == 0
    out = capsys.readouterr().out
    hyps = hyp_path.read_text().splitlines()
    assert len(hyps) == len(refs)
    bleu, chrf = BLEU().corpus_score(hyps, [refs]), CHRF().corpus_score(hyps, [refs])
    assert f"BLEU = {bleu.score:.2f}" in out  # the printed score is sacreBLEU's on these
    assert f"chrF = {chrf.score:.2f}" in out
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in out
    assert "sentences/s" in out and "beam 3" in out
    # ROUGE-L beside them: rouge-score's, with German counted as Unicode words, unstemmed
    scorer = RougeScorer(["rougeL"], use_stemmer=False, tokenizer=UnicodeWords())
    f = sum(scorer.score(r, h)["rougeL"].fmeasure
            for h, r in zip(hyps, refs, strict=True)) / len(refs)
    assert f"ROUGE-L = {100 * f:.2f}" in out and "Unicode words (lang de), no stemming" in out


def test_evaluate_rejects_misaligned_files(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "run"), "--steps", "5", "--n-train", "500",
                 "--n-test", "5"]) == 0
    (tmp_path / "a").write_text("one\ntwo\n")
    (tmp_path / "b").write_text("eins\n")
    capsys.readouterr()
    assert main(["evaluate", "translate", "--model", str(tmp_path / "run"), "--src",
                 str(tmp_path / "a"), "--ref", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "has 2 lines but" in err and len(err.strip().splitlines()) == 1
