"""The user's commands on ``rag-gates``: ``calibrate`` and ``models`` (``index`` lives with
the corpus package, ``demo`` and ``info`` in :mod:`rag_gates.cli`); :mod:`._help` holds what
every command shares (the tidy help group, the threads option, the one-line errors)."""
