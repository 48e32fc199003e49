"""attnlab.tasks: each fine-tuning task in one place: its data format, features and labels,
its recipe, prediction and scores.

* :mod:`~attnlab.tasks.ner`: named entities (CoNLL files, ``train ner``, ``ner``,
  ``evaluate ner``);
* :mod:`~attnlab.tasks.qa`: extractive question answering (SQuAD files, ``train qa``, ``qa``);
* :mod:`~attnlab.tasks.classify`: sequence classification (labelled JSON lines,
  ``train classify``, ``classify``);
* :mod:`~attnlab.tasks.choice`: multiple-choice questions scored by a language model, or by
  an encoder with a multiple-choice head (``train choice``, ``evaluate choice``);
* :mod:`~attnlab.tasks.pretrained`: the start the encoders' tasks share, a pretrained encoder with
  a new head.

A task package's ``recipe`` module is the only part that imports the trainer; predicting with
a trained model does not load it.
"""
