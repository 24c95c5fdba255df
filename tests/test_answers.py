"""Tests of kgrag_nb.answers: the one reader of an answer's first line, the one answer-list splitter, the normalisers.

Hand-computed cases for each edge the readers it replaced disagreed on (issue 24; the table in nbs/10_answers.ipynb),
the study wrappers built on it (awakening App. E short answers, BRINK App. E lists, CoE App. C phrases), and hypothesis
properties: idempotence, no line break in a first line, a joined list of clean items splits back into the items.
"""
import re

import pytest
from hypothesis import given, settings, strategies as st

from kgrag_nb.answers import acc_r_tokens, brink_normalize, first_line, split_answers, squad_normalize

SHORT = dict(labels=("- Short Answer:", "Short Answer:"), trailing=".")  # awakening App. E (baselines.parse_short_answer)
PHRASE = dict(labels=(r"(?i)(output|answer|broader term)\s*:",), trailing=".", quotes="\"'`*")  # CoE App. C (coe.parse_phrase)


# ---------------------------------------------------------------- first_line: hand-computed edges

@pytest.mark.parametrize("text, expected", [
    ("Paris", "Paris"),
    ("  Paris  \nLyon", "Paris"),  # stripped, the rest dropped
    ("\n\n \t\nParis\nLyon", "Paris"),  # leading blank lines skipped
    ("Paris\r\nLyon", "Paris"),  # Windows line end
    ("Paris\rLyon", "Paris"),  # a lone \r ends the line (brink's old split('\n') kept 'Paris\rLyon')
    ("Paris\u2028Lyon", "Paris"), ("Paris\x0bLyon", "Paris"), ("Paris\x85Lyon", "Paris"),
    ("Answer: Paris.", "Answer: Paris."),  # no options: a cue and a period stay (BRINK scores the raw line)
    ('"Paris"', '"Paris"'),  # quotes stay without `quotes`
    ("", ""), (" ", ""), ("\n\r\n\u2028", ""),  # empty text: ''
])
def test_first_line_default(text, expected):
    assert first_line(text) == expected


@pytest.mark.parametrize("text, expected", [
    (" Paris.\n- Question: x", "Paris"),  # the example's final period
    ("\n- Short Answer: William Shakespeare.", "William Shakespeare"),  # repeated cue after a blank line
    ("Short Answer: Paris", "Paris"),  # the cue without its dash
    ("- Short Answer: Short Answer: Paris", "Paris"),  # both labels, in order
    ("- Short Answer:\nParis.", "Paris"),  # a line that is only the cue is empty once cleaned: skipped
    (".\nParis", "Paris"),  # a line of only periods is skipped (the old parser returned '' here)
    ("Paris. .", "Paris"),  # cleaned until nothing changes (the old parser returned 'Paris.')
    ("Dr. No", "Dr. No"),  # only a final period goes
    ("short answer: Paris", "short answer: Paris"),  # the App. E cue is matched case-sensitively
    ("", ""),
])
def test_first_line_short_answer(text, expected):
    assert first_line(text, **SHORT) == expected


@pytest.mark.parametrize("text, expected", [
    ('\n "Canada".\nExample6', "Canada"),  # quotes and the final period
    ("Output: Soda", "Soda"), ("OUTPUT :  Soda", "Soda"), ("Broader term: business organization", "business organization"),
    ("**Elon Musk**", "Elon Musk"),  # bold marks count as quotes
    ("'Paris'.", "Paris"),  # quote, period, quote: the passes repeat
    ('"."\nRome', "Rome"),  # a line that cleans to nothing is skipped
])
def test_first_line_phrase(text, expected):
    assert first_line(text, **PHRASE) == expected


def test_first_line_labels_are_regexes_in_order():
    assert first_line("Q: A: x", labels=("Q:", "A:")) == "x"  # removed in order
    assert first_line("Q: A: x", labels=("A:", "Q:")) == "x"  # 'A:' fits only once 'Q:' is gone: the next pass removes it
    assert first_line("Q: Q: x", labels=("Q:",)) == "x"  # a cue written twice
    assert first_line("Answer 3: x", labels=(re.compile(r"answer \d+:", re.I),)) == "x"  # a compiled pattern works
    assert first_line("xAnswer: y", labels=("Answer:",)) == "xAnswer: y"  # only at the line's start


@pytest.mark.parametrize("bad", [None, 3, b"Paris", ["Paris"]])
def test_first_line_needs_a_str(bad):
    with pytest.raises(TypeError, match="completion string"):
        first_line(bad)


# ---------------------------------------------------------------- the study readers built on it

def test_study_readers_use_it():
    from kgrag_nb.studies.awakening.task1 import parse_awakening_answer, parse_status
    from kgrag_nb.studies.awakening.closed_book import parse_short_answer
    from kgrag_nb.studies.brink.methods import parse_answer, parse_answer_list
    from kgrag_nb.studies.coe.evidence import parse_phrase
    text = "\n- Short Answer: Ridley Scott.\n- Question: x"
    assert parse_short_answer(text) == parse_awakening_answer(text) == first_line(text, **SHORT) == "Ridley Scott"
    assert parse_status(text, "qa") == "repaired" and parse_status(" Ridley Scott.", "qa") == "ok"
    assert parse_status("Paris\rmore", "qa") == "ok"  # the first line ends at any line break, as first_line's do
    assert parse_answer(" 7, 8 \nQuestion: more") == first_line(" 7, 8 \nQuestion: more") == "7, 8"
    assert parse_answer_list(" 7, 1. 8\n") == split_answers("7, 1. 8") == ["7", "8"]  # the scorer's split, markers too
    assert parse_phrase('\n "Canada".\nExample6') == "Canada" and parse_phrase(" . ") is None and parse_phrase(None) is None


def test_brink_records_the_scorers_list():
    "A BRINK method's answer list (Prediction.ranked) is what the scorer splits: ';' and '|' separate, as in brink_split."
    from kgrag_nb.metrics import brink_split
    assert brink_split is split_answers
    assert split_answers("7; 8 | 9") == ["7", "8", "9"]  # the old brink_methods._split_answers gave ['7; 8 | 9']


# ---------------------------------------------------------------- split_answers and the normalisers: hand-computed

@pytest.mark.parametrize("raw, expected", [
    ("a, b\nc|d;e", ["a", "b", "c", "d", "e"]),
    ("Barack Obama and Joe Biden", ["Barack Obama and Joe Biden"]),  # never on spaces or ' and '
    ("- 39\n* 40\n3) 41\n10. 42\n\u2022 43", ["39", "40", "41", "42", "43"]),  # list markers dropped
    ("1.5, 2", ["1.5", "2"]),  # '1.' without a space after it is not a marker
    (" ,\n, ", []), ("", []),
    ("a\rb", ["a\rb"]),  # \r is no separator: stripped only at a piece's ends
    (["x, y", " z "], ["x, y", "z"]),  # a list is already split
])
def test_split_answers(raw, expected):
    assert split_answers(raw) == expected


def test_split_answers_types():
    with pytest.raises(TypeError, match="raw output"): split_answers(42)
    with pytest.raises(TypeError, match="each item"): split_answers(["a", 3])


def test_normalisers_hand():
    assert acc_r_tokens("Saint-Denis (1998)") == ["saint", "denis", "1998"]  # punctuation -> space
    assert squad_normalize("Saint-Denis, THE city") == "saintdenis city"  # ASCII punctuation deleted, article dropped
    assert squad_normalize("“Paris”") == "“paris”" and acc_r_tokens("“Paris”") == ["paris"]  # curly quotes: SQuAD keeps them
    assert brink_normalize("An <pad>Apple<PAD> pie.") == "apple pie" and brink_normalize("the") == ""
    with pytest.raises(TypeError, match=r"str\(\)"): brink_normalize(3)


# ---------------------------------------------------------------- properties

OPTIONS = st.sampled_from([{}, SHORT, PHRASE, dict(trailing=".!?", quotes="\"'")])
pieces = st.sampled_from(list("ab .\"'*:-\n\r\t\u2028") + ["Short Answer:", "- Short Answer:", "Output:"])
messy = st.lists(pieces, max_size=15).map("".join) | st.text(max_size=40)  # cues, quotes, periods and line breaks, or anything
PROPS = settings(max_examples=300, deadline=None)


@PROPS
@given(messy, OPTIONS)
def test_first_line_idempotent_and_one_line(text, opts):
    once = first_line(text, **opts)
    assert first_line(once, **opts) == once
    assert len(once.splitlines()) <= 1 and "\n" not in once and once == once.strip()


@PROPS
@given(messy)
def test_first_line_is_first_nonblank_line_without_options(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    assert first_line(text) == (lines[0] if lines else "")


item = st.text(alphabet=st.characters(whitelist_categories=("L", "N"), whitelist_characters=" .-'"), min_size=1, max_size=15) \
         .map(str.strip).filter(lambda s: s and not re.match(r"(?:[-*\u2022]|\d+[.)])(\s|$)", s))
# an item that is or starts with a list marker ("-", "1.", "- x") is not an answer: followed by a separator's space it is a
# marker, which `split_answers` strips (hypothesis found ['-', '0'] joined by ' | ')


@PROPS
@given(st.lists(item, max_size=6), st.sampled_from([", ", ",", "; ", "\n", " | "]))
def test_split_of_a_join_round_trips(items, sep):
    assert split_answers(sep.join(items)) == items
    assert split_answers(items) == items


@PROPS
@given(st.text(max_size=30))
def test_normalisers_idempotent(s):
    assert squad_normalize(squad_normalize(s)) == squad_normalize(s)
    assert brink_normalize(brink_normalize(s)) == brink_normalize(s)
    assert acc_r_tokens(" ".join(acc_r_tokens(s))) == acc_r_tokens(s)
