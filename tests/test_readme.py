"""The README cannot drift from the commands: every `python -m vcd_helpers` command in its code
blocks parses (a train command resolves to a valid Config), every preset it names exists, and
every `make` target it names is in the Makefile."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vcd_helpers.runs.cli import _parser, resolve_config
from vcd_helpers.config import available_presets

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CODE = "\n".join(re.findall(r"```bash\n(.*?)```", README, flags=re.S))


def _commands() -> list[list[str]]:
    """The arguments after `-m vcd_helpers` of each command in the README's bash blocks."""
    commands = []
    for line in CODE.splitlines():
        if "-m vcd_helpers " in line:
            words = shlex.split(line.split("-m vcd_helpers ", 1)[1], comments=True)
            commands.append(words)
    return commands


def test_the_readme_shows_each_subcommand():
    assert {words[0] for words in _commands()} == {"train", "evaluate", "bench"}


@pytest.mark.parametrize("words", _commands(), ids=lambda words: " ".join(words))
def test_each_readme_command_parses(words):
    args = _parser().parse_args(words)
    if args.command == "train":
        resolve_config(args)  # unknown presets or bad values raise


def test_the_presets_the_readme_names_exist():
    sentence = re.search(r"Presets: (.*?)\.\s", README, flags=re.S).group(1)
    named = re.findall(r"`([a-z_]+)`", sentence)
    assert named and set(named) == set(available_presets()), (named, available_presets())


def test_the_make_targets_the_readme_names_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.search(r"^\.PHONY: (.*)$", makefile, flags=re.M).group(1).split())
    named = set(re.findall(r"\bmake ([a-z]+)\b", README))
    assert named and named <= targets, named - targets
