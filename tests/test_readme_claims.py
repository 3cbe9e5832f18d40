"""README.md quotes only what the committed results hold: every decimal figure, percentage, ratio (1.24×) or
power of ten in its prose must be a number of some JSON under benchmarks/results at the README's rounding, and an
interval (a difference with its bounds) or a speed-up's spread over pairs must be one comparison's or one bench's.
Code (fenced blocks and `spans`) is not prose: commands and options are not results. The few figures that are
no result — an install size, a confidence level, the papers' own settings — are listed below with why; a
figure from an interval, a manifest that is not committed or memory wins nobody wrote down fails."""
import bisect
import json
import math
import re

import pytest

from dsprune.settings import REPO_ROOT

RESULTS = REPO_ROOT / "benchmarks" / "results"
README = REPO_ROOT / "README.md"

# figure as written -> why it is not a result
EXEMPT = {
    "2.2": "size of the virtualenv the first `make` installs",
    "95 %": "the confidence level of every interval",
    "1e-8": "EffiR's λ, quoted from the paper",
    "1e-4": "EffiR's learning rate, quoted from the paper",
}
# sections whose figures are arithmetic shown in the text, for hardware this machine does not have
EXEMPT_SECTIONS = {"Running on a cluster"}

SUPER = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
FIGURE = re.compile(
    r"(?<![\w.\-/§])(?P<sign>[+\-−])?(?:"
    r"(?P<mant>\d+(?:\.\d+)?)?·?10(?P<sup>[⁻][⁰¹²³⁴⁵⁶⁷⁸⁹]+)"       # 3·10⁻⁶, 10⁻⁶
    r"|(?P<sci>\d+(?:\.\d+)?[eE]-?\d+)"                              # 1e-5
    r"|(?P<pct>\d+(?:\.\d+)?)\s?%"                                   # 30 %, 0.14 %
    r"|(?P<dec>\d+\.\d+)(?P<times>×)?(?![\d.]*\.\d)"                 # 0.513, 1.24×; not 2.13.0
    r")(?![\w.]*\w)")
NUMBER = re.compile(r"[+\-]?\d+(?:\.\d+)?(?:[eE][+\-]?\d+)?")
# a difference with its interval, "−0.0337 [−0.0673, −0.0000]", and a speed-up's spread over pairs,
# "1.12–1.18×": each figure alone may be held somewhere, so the three (or two) must be held together, by one
# comparison or bench
SIGNED = r"[+\-−]?\d+\.\d+"
INTERVAL = re.compile(rf"(?<![\w.])({SIGNED})\s?\[({SIGNED}),\s?({SIGNED})\]")
SPREAD = re.compile(r"(?<![\w.])(\d+\.\d+)–(\d+\.\d+)×")


def prose(text: str) -> str:
    """The README without code, link targets and the exempt sections."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    parts = re.split(r"(?m)^(## .*)$", text)
    keep, skip = [parts[0]], False
    for p in parts[1:]:
        if p.startswith("## "):
            skip = p[3:].strip() in EXEMPT_SECTIONS
        elif not skip:
            keep.append(p)
    return "".join(keep)


def figures(text: str) -> list[tuple[str, float, float, bool]]:
    """(as written, value, half a unit of its last digit, is a percentage) of every figure in ``text``."""
    out = []
    for m in FIGURE.finditer(text):
        sign = -1.0 if m["sign"] in ("-", "−") else 1.0
        if m["sup"]:
            exp = int(m["sup"].translate(SUPER))
            mant = float(m["mant"]) if m["mant"] else 1.0
            out.append((m[0].strip(), sign * mant * 10.0 ** exp, 0.5 * 10.0 ** exp, False))
        elif m["sci"]:
            v = float(m["sci"])
            out.append((m[0].strip(), sign * v, 0.5 * 10.0 ** math.floor(math.log10(abs(v))), False))
        elif m["pct"]:
            digits = len(m["pct"].split(".")[1]) if "." in m["pct"] else 0
            out.append((m[0].strip(), sign * float(m["pct"]), 0.5 * 10.0 ** -digits, True))
        else:
            digits = len(m["dec"].split(".")[1])
            out.append((m[0].strip(), sign * float(m["dec"]), 0.5 * 10.0 ** -digits, False))
    return out


def _numbers(obj, out: list) -> None:
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        out.append(float(obj))
    elif isinstance(obj, str):
        out.extend(float(x) for x in NUMBER.findall(obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k == "per_query":
                continue        # hundreds of scores between 0 and 1: any figure would find one to round to
            _numbers(k, out)
            _numbers(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _numbers(v, out)


def _groups(obj, intervals: list, spreads: list) -> None:
    """(diff, low, high) of every paired comparison and (min, max) of every bench in ``obj``."""
    if isinstance(obj, dict):
        if {"diff", "low", "high"} <= obj.keys():
            intervals.append((obj["diff"], obj["low"], obj["high"]))
        if {"min", "max"} <= obj.keys():
            spreads.append((obj["min"], obj["max"]))
        for v in obj.values():
            _groups(v, intervals, spreads)
    elif isinstance(obj, list):
        for v in obj:
            _groups(v, intervals, spreads)


@pytest.fixture(scope="module")
def docs() -> list:
    """Every committed results JSON, read once for both checks."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(RESULTS.rglob("*.json"))]


@pytest.fixture(scope="module")
def groups(docs) -> tuple[list, list]:
    intervals: list = []
    spreads: list = []
    for doc in docs:
        _groups(doc, intervals, spreads)
    return intervals, spreads


def _value(raw: str) -> tuple[float, float]:
    """A written figure's value and half a unit of its last digit."""
    return float(raw.replace("−", "-")), 0.5 * 10.0 ** -len(raw.split(".")[1])


def _rounds_to(written: list[str], numbers) -> bool:
    return all(isinstance(x, (int, float)) and abs(x - v) <= half + 1e-12
               for (v, half), x in zip(map(_value, written), numbers))


def ungrouped(text: str, groups: tuple[list, list]) -> list[str]:
    """Intervals and spreads of ``text`` that no single comparison or bench holds as written (a difference may
    be written the other way round: −diff [−high, −low])."""
    intervals, spreads = groups
    bad = []
    for m in INTERVAL.finditer(text):
        if not any(_rounds_to(list(m.groups()), t) or _rounds_to(list(m.groups()), (-t[0], -t[2], -t[1]))
                   for t in intervals):
            bad.append(m[0])
    for m in SPREAD.finditer(text):
        if not any(_rounds_to(list(m.groups()), s) for s in spreads):
            bad.append(m[0])
    return bad


@pytest.fixture(scope="module")
def held(docs) -> list[float]:
    out: list[float] = []
    for doc in docs:
        _numbers(doc, out)
    return sorted(x for x in out if math.isfinite(x))


def unheld(text: str, held: list[float]) -> list[str]:
    """Figures of ``text`` that no committed number rounds to."""
    def has(v: float, half: float) -> bool:
        i = bisect.bisect_left(held, v - half - 1e-12)
        return i < len(held) and held[i] <= v + half + 1e-12

    bad = []
    for raw, v, half, pct in figures(text):
        if raw.lstrip("+-−~") in EXEMPT:
            continue
        ok = has(v / 100, half / 100) if pct else has(v, half)
        if not ok and v < 0:          # a figure written with its sign may be held as a size (a loss "−0.2")
            ok = has(-v / 100, half / 100) if pct else has(-v, half)
        if not ok:
            bad.append(raw)
    return bad


def test_the_check_finds_figures_the_results_do_not_hold(held):
    # the examples: a mask difference no JSON holds, an interval only rendering computes, a ratio
    text = ("DAI's mask differs from magnitude's in only 0.14 % of the weights; magnitude − random is +0.05517 "
            "[+0.00113, +0.11731]; the Fisher term is 3·10⁻⁶ of it; 196 of 300 (65.3 %) share a document.")
    assert figures(text)[0][:2] == ("0.14 %", 0.14)
    # against a fixed set, so a later result that happens to hold one of them cannot hide a broken check
    assert unheld(text, sorted([0.00113, 0.653, 196.0, 300.0])) == ["0.14 %", "+0.05517", "+0.11731", "3·10⁻⁶"]
    assert "65.3 %" not in unheld(text, held)            # benchmarks/results/scifact_overlap.json holds it
    # versions, names and code are not figures
    assert figures(prose("torch 2.13.0, SmolLM2-135M, Qwen2.5 and `--lr 0.3`\n```\nlr 0.4\n```")) == []


def test_readme_quotes_only_committed_figures(held):
    bad = unheld(prose(README.read_text(encoding="utf-8")), held)
    assert not bad, (f"README.md quotes figures no JSON in benchmarks/results holds: {bad}. Point to "
                     "benchmarks/RESULTS.md instead, or commit the result that holds them.")


def test_the_check_pairs_an_interval_with_its_difference_and_a_spread_with_its_bench():
    groups = ([(-0.0337, -0.0673, -1.8e-05)], [(1.1623, 1.1749)])
    text = "−0.0337 [−0.0673, −0.0000] and +0.0337 [+0.0000, +0.0673]; pairs 1.16–1.17×"
    assert ungrouped(text, groups) == []
    # each figure is held, but not together: another comparison's low end, a max rounded up
    bad = "−0.0337 [−0.0600, −0.0000]"
    assert ungrouped(f"{bad}; pairs 1.16–1.18×", groups) == [bad, "1.16–1.18×"]


def test_readme_intervals_and_spreads_are_each_one_results_figures(groups):
    bad = ungrouped(prose(README.read_text(encoding="utf-8")), groups)
    assert not bad, (f"README.md quotes intervals or speed-up spreads that no one comparison or bench in "
                     f"benchmarks/results holds together: {bad}")
