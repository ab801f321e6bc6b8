"""The reading time of a chapter by the introduction's rule, from its committed notebook.

    .venv/bin/python tools/reading_time.py notebooks/*.ipynb

The rule (book/intro.md): the prose (markdown, figure captions and generated sentences; not code,
printed output or the exercises' dropdowns) at 120 words a minute, plus a minute per displayed
equation and per figure and half a minute per visible code cell. The exercises: 10 minutes for an
easy one, 20 for a medium and 40 for a hard one, 60 where it says "about an hour" at its start, plus reading
their hints and solutions at the same pace.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

WORDS_PER_MINUTE = 120
EXERCISE_MINUTES = {"easy": 10, "medium": 20, "hard": 40}
HIDDEN = {"hide-input", "remove-input", "remove-cell"}
DROPDOWN = re.compile(r":::\{admonition\}[^\n]*\n:class: dropdown\n.*?\n:::", re.S)
EXERCISE = re.compile(r"\*\*Exercise \d+ \((easy|medium|hard)([^)]*)\)\.?\*\*([^\n]{0,30})")


def _words(text: str) -> int:
    """Words of prose: displayed and inline maths, code blocks and roles count as one word or none."""
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]*\$", " x ", text)
    text = re.sub(r"\{[a-z]+\}`[^`]*`", " x ", text)
    return len(re.findall(r"[A-Za-z0-9][\w'’.,-]*", text))


def reading_time(path: str | Path) -> tuple[float, float]:
    """(minutes to read the chapter, minutes for its exercises) of a committed notebook."""
    notebook = json.loads(Path(path).read_text())
    prose = dropdown_words = equations = figures = visible_code = 0
    exercises = 0.0
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            dropdowns = DROPDOWN.findall(source)
            body = DROPDOWN.sub(" ", source)
            dropdown_words += sum(map(_words, dropdowns))
            prose += _words(body)
            equations += len(re.findall(r"^\s*\$\$", body, re.M)) // 2
            for grade, remark, opening in EXERCISE.findall(source):  # its own time, in its heading or first words
                exercises += 60 if "about an hour" in (remark + opening).lower() else EXERCISE_MINUTES[grade]
            continue
        tags = set(cell["metadata"].get("tags", []))
        prose += _words(cell["metadata"].get("mystnb", {}).get("figure", {}).get("caption", ""))
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            figures += "image/png" in data or "image/svg+xml" in data
            if "text/markdown" in data and "remove-output" not in tags:
                markdown = "".join(data["text/markdown"])
                dropdowns = DROPDOWN.findall(markdown)
                dropdown_words += sum(map(_words, dropdowns))
                prose += _words(DROPDOWN.sub(" ", markdown))
        visible_code += not (tags & HIDDEN)
    reading = prose / WORDS_PER_MINUTE + equations + figures + visible_code / 2
    return reading, exercises + dropdown_words / WORDS_PER_MINUTE


if __name__ == "__main__":
    for name in sys.argv[1:]:
        read, practice = reading_time(name)
        print(f"{Path(name).stem:45s} {read:4.0f} minutes to read, {practice / 60:.1f} hours of exercises")
