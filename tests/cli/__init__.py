"""The ``attnlab`` command line: a happy path and bad input for every subcommand.

Run in-process (``from attnlab.cli import main``) with capsys; runs are tiny and shared
(tests/cli/conftest.py). Bad input means: exit code 2, one line on stderr starting ``attnlab``
and naming the flag or file, never a traceback (tests/cli/helpers.py::assert_bad_input).

Where each subcommand is covered (H: happy path, B: bad input):

=================  ==========================================================================
info               H tests/test_cli.py, tests/test_hardware.py, cli/test_info.py;
                   B tests/test_cli.py, cli/test_info.py
train translate    H tests/training/test_trainer.py, test_evaluate.py, test_precision.py;
                   B tests/training/test_trainer.py, cli/test_train.py (``--out``)
train lm           H tests/training/test_lm.py;
                   B tests/training/test_lm.py, cli/test_train.py (``--out``)
train mlm          H cli/test_train.py; B cli/test_train.py
train classify     H tests/tasks/test_classify.py;
                   B tests/tasks/test_classify.py, cli/test_train.py (``--out``)
average            H tests/training/test_trainer.py; B tests/training/test_lm.py (exit code
                   only), cli/test_translate.py
generate           H tests/training/test_lm.py; B tests/training/test_lm.py, cli/test_generate.py
translate          H tests/training/test_trainer.py;
                   B tests/training/test_trainer.py, tests/training/test_lm.py,
                   cli/test_translate.py
evaluate           H tests/training/test_evaluate.py;
                   B tests/training/test_evaluate.py, cli/test_translate.py (``--out``)
demo               H tests/test_demo.py; B cli/test_demo.py
tokenize train     H tests/tokenizers/test_bpe_train.py, cli/test_tokenize.py;
                   B cli/test_tokenize.py
tokenize encode    H tests/tokenizers/test_bpe_train.py, cli/test_tokenize.py;
                   B tests/tokenizers/test_bpe_train.py
classify           H tests/tasks/test_classify.py; B cli/test_apply.py
embed              H tests/interop/test_minilm.py, cli/test_apply.py; B cli/test_apply.py
explain            H tests/explain/test_walkthrough.py;
                   B tests/explain/test_walkthrough.py (exit code and message), cli/test_explain.py
plot               H tests/explain/test_pictures.py; B cli/test_explain.py
=================  ==========================================================================

Each file's docstring names the tests elsewhere by function.
"""
