"""nbval-sanitize.cfg: two executions of the same code compare equal, different code does not."""

from __future__ import annotations

import re
from pathlib import Path

from nbval.plugin import get_sanitize_patterns

ROOT = Path(__file__).resolve().parent.parent
PATTERNS = get_sanitize_patterns((ROOT / "nbval-sanitize.cfg").read_text())


def sanitize(text: str) -> str:
    for regex, replace in PATTERNS:
        text = re.sub(regex, replace, text)
    return text


WATERMARK = """Last run: {date} UTC
Code: git commit {commit}
Machine: x86_64 Linux ({cpu}), Python 3.11.7
Load average: {load} (1 min) on {cores} cores
Run profile: {profile}
tensorflow=={tf}
"""


def watermark(date="2026-11-25 09:12", commit="8c87b79dd9749d9e96c37a0ac4936e3bdcc30291", cpu="AMD EPYC",
              load="2.4", cores=2, profile="book", tf="2.21.0") -> str:
    return WATERMARK.format(date=date, commit=commit, cpu=cpu, load=load, cores=cores, profile=profile, tf=tf)


def test_the_test_run_uses_the_sanitize_file(pytestconfig):
    assert Path(pytestconfig.option.nbval_sanitize_with).resolve() == ROOT / "nbval-sanitize.cfg"


def test_a_watermark_from_another_execution_compares_equal():
    later = watermark(date="2026-12-01 17:40", commit="dbda647d0654299e90a1750717fda3002c3df863 with uncommitted changes",
                      cpu="Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", load="7.9", cores=8, profile="test")
    assert sanitize(later) == sanitize(watermark())


def test_the_load_beside_a_verdict_compares_equal_but_not_the_verdict():
    verdict = "0.916 x [0.868, 0.987] (10 rounds): {} [load average {} on {} cores; {} cores busy, {} of them by the timing]"
    assert sanitize(verdict.format("faster", "1.9", 2, "2.0", "1.0")) == sanitize(verdict.format("faster", "12.3", 8, "7.9", "2.0"))
    assert sanitize(verdict.format("faster", "1.9", 2, "2.0", "1.0")) != sanitize(verdict.format("slower", "1.9", 2, "2.0", "1.0"))


def test_another_package_version_does_not():
    assert sanitize(watermark(tf="2.22.0")) != sanitize(watermark())


def test_durations_and_rates_are_replaced_but_counts_and_ratios_are_not():
    book = "2,347 batches/s of 100 images = 234,653 images/s (0.43 ms per batch); second load 0.001 s"
    test = "2,008 batches/s of 100 images = 200,761 images/s (0.50 ms per batch); second load 0.000 s"
    assert sanitize(book) == sanitize(test)
    assert sanitize(book.replace("100 images", "50 images")) != sanitize(test)
    assert sanitize("0.916 x [0.868, 0.987]: faster") != sanitize("0.930 x [0.862, 0.947]: faster")
    assert sanitize("10 steps in 3 s") == "10 steps in DURATION"


def test_tables_of_provenance_compare_equal():
    row = "| `00` | {} | `{}` | AMD EPYC | 2.4 | book |"
    assert sanitize(row.format("2026-11-25 09:12", "8c87b79")) == sanitize(row.format("2026-12-01 10:00", "dbda647"))
    assert sanitize("| code | 854cc5fc7c077c72bd8e5f4bf703abe7b408be07 |") == "| code | COMMIT |"
    assert sanitize("| machine | x86_64 Linux, AMD EPYC |") == sanitize("| machine | aarch64 Darwin, Apple M2 |")


def test_random_ids_and_addresses_are_replaced():
    assert sanitize('<div id="vcd-explorer-829094e9e1">') == sanitize('<div id="vcd-explorer-5fb193e272">')
    assert sanitize("<object at 0x7f3a2c1d9e80>") == sanitize("<object at 0x7f00aa11bb22>")
