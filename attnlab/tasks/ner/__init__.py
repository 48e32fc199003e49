"""Named-entity recognition with an encoder: one BIO tag per word, read off the word's first
subword (Devlin et al., 2019, section 5.3).

    words     EU      rejects      German    call
    pieces    [CLS] eu  rejects  german  call [SEP]       (an uncased WordPiece vocabulary)
    labels    -100  B-ORG O      B-MISC  O    -100        training: the loss ignores -100
    logits    (batch, seq, num_labels) from BERT's ``tokens`` head; a word's tag is the argmax
              at its first piece

A word that splits into several pieces (``Lauterbach`` → ``lauter ##bach``) is labelled at
``lauter`` only; the loss ignores ``##bach``, as transformers' ``run_ner.py`` does with
``label_all_tokens=False``. Sentences are split into words as BERT's pre-tokenizer splits
them (whitespace, then punctuation apart), so a word's pieces are those the whole text
would give. A sentence longer than the model's context is tagged in chunks of whole words.

* :mod:`~attnlab.tasks.ner.data`: CoNLL files, the tag set, a sentence's pieces and the
  training rows;
* :mod:`~attnlab.tasks.ner.recipe`: ``train ner`` (:class:`NERRecipe`);
* :mod:`~attnlab.tasks.ner.predict`: the tags of words and the entities of a text
  (``attnlab ner``), and entity-level precision, recall and F1 (``evaluate ner``).
"""

from attnlab.tasks.ner.data import (
    Pieces,
    Sentence,
    conll_files,
    encode_sentences,
    read_conll,
    tag_set,
    word_pieces,
)
from attnlab.tasks.ner.predict import (
    EntityScores,
    entities,
    entity_scores,
    predict_tags,
    score,
    split_words,
    tag_text,
)

__all__ = ["Sentence", "read_conll", "conll_files", "tag_set", "Pieces", "word_pieces",
           "encode_sentences", "entities", "predict_tags", "split_words", "tag_text",
           "EntityScores", "entity_scores", "score"]
