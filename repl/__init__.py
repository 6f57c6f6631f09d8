"""The interactive REPL: settings, the command table, running and showing strategies.

Only :mod:`repl.settings` and :mod:`repl.commands` are imported by ``infer.py``
before the models load; they stay free of torch so ``--help`` is instant.
"""
