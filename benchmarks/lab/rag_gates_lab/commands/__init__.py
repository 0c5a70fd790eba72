"""The lab's research commands: ``rag-gates cbdr``, ``deeprag`` and ``srrag`` (training and
labelling from the QA datasets)."""
