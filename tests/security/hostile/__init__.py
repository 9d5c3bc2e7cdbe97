"""The parts of the hostile-input corpus, one module per kind of input.

``tests/security/make_corpus.py`` runs them in order and writes the file.
"""
