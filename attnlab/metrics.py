"""Scores of hypotheses against references, one example each: BLEU and chrF (sacreBLEU), and
ROUGE (Google's ``rouge-score``, the reference implementation).

ROUGE (Lin, 2004), for one hypothesis h and its reference r, counting with multiplicity:

    ROUGE-N   P = |grams_n(h) ∩ grams_n(r)| / |grams_n(h)|,   R = |…∩…| / |grams_n(r)|
    ROUGE-L   P = LCS(h, r) / |h|,   R = LCS(h, r) / |r|       (longest common subsequence)
    F = 2PR / (P + R)

ROUGE-N's recall is the course's definition (overlapping n-grams over the reference's n-grams);
ROUGE-Lsum takes the LCS sentence by sentence (the union of each reference sentence's LCS with
every hypothesis sentence), an example's sentences being its own lines. Each figure here is the
mean over examples of the per-example P, R and F (no bootstrap resampling).

``rouge-score`` tokenizes English: lower-case, only ``[a-z0-9]`` kept, and (here) Porter
stemming. Any other language goes through :class:`UnicodeWords` with stemming off, so that
"Straße" or "élan" are words and not dropped; the output names the choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


class UnicodeWords:
    """rouge-score's tokenizer interface for any language: lower-cased runs of Unicode word
    characters (letters, digits, underscore), so "Zweiundvierzig Äpfel" -> ["zweiundvierzig",
    "äpfel"]."""

    def tokenize(self, text: str) -> list[str]:
        return re.findall(r"\w+", text.lower())


@dataclass(frozen=True)
class Rouge:
    """Means over examples of one ROUGE type's precision, recall and F-measure, in [0, 1]."""

    precision: float
    recall: float
    fmeasure: float


def rouge_tokenizer(lang: str) -> tuple[object | None, bool, str]:
    """``(tokenizer, stem, description)`` for text in ``lang``: rouge-score's own English
    tokenizer with Porter stemming for ``en``, :class:`UnicodeWords` without stemming else."""
    if lang == "en":
        return None, True, "rouge-score's English tokenizer ([a-z0-9] kept), Porter stemming"
    return UnicodeWords(), False, f"Unicode words (lang {lang}), no stemming"


def rouge(hyps: list[str], refs: list[str], lang: str = "en") -> dict[str, Rouge]:
    """ROUGE-1, -2, -L and -Lsum of ``hyps`` against ``refs`` (one example each, same length),
    averaged over examples; see the module docstring."""
    from rouge_score import rouge_scorer

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    tokenizer, stem, _ = rouge_tokenizer(lang)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=stem, tokenizer=tokenizer)
    totals = {t: [0.0, 0.0, 0.0] for t in ROUGE_TYPES}
    for hyp, ref in zip(hyps, refs, strict=True):
        for name, score in scorer.score(ref, hyp).items():  # rouge-score: (target, prediction)
            for i, value in enumerate((score.precision, score.recall, score.fmeasure)):
                totals[name][i] += value
    n = max(len(hyps), 1)
    return {name: Rouge(*(v / n for v in values)) for name, values in totals.items()}


def corpus_bleu(hyps: list[str], refs: list[str]):
    """``(score, signature)``: sacreBLEU's corpus BLEU of ``hyps`` against one reference each
    (detokenised, cased, 13a), and the signature that names those settings."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    return metric.corpus_score(hyps, [refs]), str(metric.get_signature())


def text_scores(hyps: list[str], refs: list[str], lang: str = "en") -> list[str]:
    """The lines ``attnlab evaluate`` prints: sacreBLEU's corpus BLEU (detokenised, cased) and
    its signature, chrF, and each ROUGE type's mean F-measure with precision and recall."""
    from sacrebleu.metrics import CHRF

    bleu, signature = corpus_bleu(hyps, refs)
    lines = [f"{bleu}", f"signature: {signature}",
             f"chrF = {CHRF().corpus_score(hyps, [refs]).score:.2f}"]
    for name, r in rouge(hyps, refs, lang).items():
        lines.append(f"{name.replace('rouge', 'ROUGE-')} = {100 * r.fmeasure:.2f} "
                     f"(P {100 * r.precision:.2f}, R {100 * r.recall:.2f})")
    lines.append(f"ROUGE: mean over {len(hyps)} examples; {rouge_tokenizer(lang)[2]}")
    return lines
