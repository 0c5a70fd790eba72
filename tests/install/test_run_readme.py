"""The README runner reads what the READMEs say (``make test-install`` runs it for real): which
blocks install, which run, and that a skipped block is declared to the reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.install.run_readme import ROOT, install_commands, parse, snippets

READMES = [ROOT / "README.md", ROOT / "integrations" / "langchain" / "README.md",
           ROOT / "integrations" / "llama-index" / "README.md"]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_readme_installs_in_one_line_with_the_models_and_pip_check(readme: Path) -> None:
    commands = install_commands(readme)
    pip = [c for c in commands if c.startswith("pip install") and '-e ".[' in c]
    assert len(pip) == 1, commands  # one line: the core and the integration(s) together
    assert "-c constraints.txt" in pip[0]  # the CPU torch pin
    assert "rag-gates models install" in commands and "pip check" in commands
    assert commands.index("rag-gates models install") < commands.index("pip check")
    if readme.parent.name in ("langchain", "llama-index"):
        assert f"-e integrations/{readme.parent.name}" in pip[0]
    else:
        assert "-e integrations/langchain" in pip[0] and "-e integrations/llama-index" in pip[0]


def test_readme_python_blocks_all_run_and_start_from_the_app() -> None:
    blocks = parse(ROOT / "README.md")
    python = [b for b in blocks if b.lang == "python"]
    assert python and snippets(ROOT / "README.md") == python  # none skipped
    assert "# Your app" in python[0].code  # `index` and `vectorstore` are built in view
    assert "index = " in python[0].code and "vectorstore = " in python[0].code


def test_a_skipped_block_must_say_so_to_the_reader(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("Text.\n<!-- readme-test: skip: needs a GPU -->\n```python\nx = 1\n```\n")
    with pytest.raises(SystemExit, match="not run"):
        parse(readme)
    readme.write_text("This block is not run: it needs a GPU.\n"
                      "<!-- readme-test: skip: needs a GPU -->\n```python\nx = 1\n```\n"
                      "```python\ny = 2\n```\n")
    assert [b.code for b in snippets(readme)] == ["y = 2\n"]
    readme.write_text("This is not run.\n<!-- readme-test: skip -->\n```python\nx = 1\n```\n")
    with pytest.raises(SystemExit, match="reason"):
        parse(readme)


def test_install_lines_drop_comments(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("<!-- readme-test: install -->\n```bash\n# a comment\n"
                      "pip install x   # why\n\nrag-gates models install\n```\n"
                      "```bash\nnot-installed\n```\n")
    assert install_commands(readme) == ["pip install x", "rag-gates models install"]
