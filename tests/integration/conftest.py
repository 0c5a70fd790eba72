"""The reader's project for the tests that run documents' snippets (see ``snippets.py``)."""

from tests.integration.snippets import documents, home, workdir

__all__ = ["documents", "home", "workdir"]
