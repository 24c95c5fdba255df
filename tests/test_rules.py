"""Tests of kgrag_nb.studies.brink.rules: hand-built KGs whose rules and measures are computed by hand, a pure-Python brute-force
miner (every substitution enumerated) cross-checked against the vectorised miner with hypothesis, and Family (real data
from the offline mirror) against BRINK (brink_incomplete_kg_benchmark.txt) Table 1."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from kgrag_nb.kg import KG
from kgrag_nb.studies.brink.rules import (Atom, Rule, Grounding, mine_rules, rule_measures, classify_rule, parse_amie, groundings,
                            rules_to_frame, write_rules_tsv, read_rules_tsv, load_kg_or_tsv, TSV_COLUMNS, brink_table1,
                            APP_A2, _by_type, amie_2019_dropped, amie_filters)


# ---------------------------------------------------------------- brute-force reference (pure Python, tiny KGs)
def brute_measures(triples, h, body):
    """(support, body size, PCA body size) of the integer rule body => h(0, 1) by enumerating every substitution.
    Variables are ints >= 0 (0 = ?a, 1 = ?b), constants -entity-1; AMIE's functional variable (Lajus et al. 2020)."""
    facts = set(map(tuple, triples))
    ents = sorted({x for s, _, o in facts for x in (s, o)})
    vars_ = sorted({x for a in body for x in a[1:] if x >= 0} | {0, 1})
    def arg(env, x): return env[x] if x >= 0 else -x - 1
    pairs = set()
    for vals in itertools.product(ents, repeat=len(vars_)):
        env = dict(zip(vars_, vals))
        if all((arg(env, s), r, arg(env, o)) in facts for r, s, o in body):
            pairs.add((env[0], env[1]))
    head = {(s, o) for s, r, o in facts if r == h}
    subj, obj = {s for s, _ in head}, {o for _, o in head}
    on_subject = len(subj) / len(head) >= len(obj) / len(head)  # functionality >= inverse functionality
    pca = sum(1 for a, b in pairs if (a in subj if on_subject else b in obj))
    return len(pairs & head), len(pairs), pca


def canon(body):
    extra = sorted({x for a in body for x in a[1:] if x >= 2})
    return min(tuple(sorted((r, m.get(s, s), m.get(o, o)) for r, s, o in body))
               for m in (dict(zip(extra, p)) for p in itertools.permutations(range(2, 2 + len(extra)))))


def all_bodies(relations, max_body, n_vars=4):
    "Every closed, connected body without duplicate or reflexive atoms, 1..max_body atoms, canonical."
    atoms = [(r, s, o) for r in relations for s in range(n_vars) for o in range(n_vars) if s != o]
    seen = set()
    for k in range(1, max_body + 1):
        for combo in itertools.combinations(atoms, k):
            occ = {0: 1, 1: 1}
            for _, s, o in combo: occ[s] = occ.get(s, 0) + 1; occ[o] = occ.get(o, 0) + 1
            if any(c < 2 for c in occ.values()) or sorted(occ) != list(range(len(occ))): continue
            conn, todo = {0, 1}, list(combo)
            while True:
                nxt = [a for a in todo if {a[1], a[2]} & conn]
                if not nxt: break
                for a in nxt: conn |= {a[1], a[2]}; todo.remove(a)
            if todo: continue
            c = canon(combo)
            if c not in seen: seen.add(c); yield c


def brute_mine(triples, n_rel, max_len, min_hc, min_pca, min_support=2, min_std=0.0, recursivity_limit=3,
               min_initial_support=1, amie_compat=None):
    """AMIE's output by exhaustive enumeration: every closed connected rule whose head relation has at least
    min_initial_support facts, with head coverage and support above the thresholds, PCA (and standard) confidence above
    theirs, and PCA strictly above every closed sub-body rule's; amie_compat="2019" leaves out the rules of even length
    >= 4 in which every relation occurs exactly twice."""
    bodies = list(all_bodies(range(n_rel), max_len - 1))
    size = {r: sum(1 for t in triples if t[1] == r) for r in range(n_rel)}
    measured = {}
    for h in range(n_rel):
        if size[h] < max(min_support, 1, min_initial_support): continue
        for body in bodies:
            counts = {}
            for a in ((h, 0, 1),) + body: counts[a[0]] = counts.get(a[0], 0) + 1
            if (h, 0, 1) in body or max(counts.values()) > recursivity_limit: continue
            s, bs, pb = brute_measures(triples, h, body)
            if s > 0 and s >= max(min_support, min_hc * size[h]): measured[(h, body)] = (s, bs, pb)
    out = {}
    for (h, body), (s, bs, pb) in measured.items():
        if s / pb < min_pca or s / bs < min_std: continue
        subs = [measured.get((h, canon(sub))) for k in range(1, len(body)) for sub in itertools.combinations(body, k)]
        if not all(m is None or s / pb > m[0] / m[2] for m in subs): continue
        rels = [h] + [a[0] for a in body]
        if amie_compat == "2019" and len(rels) % 2 == 0 and len(rels) >= 4 and all(rels.count(r) == 2 for r in rels):
            continue
        out[(h, body)] = (s, bs, pb)
    return out


def encode(kg, rule):
    "Integer form of a Rule as the brute-force functions take it."
    ids = {rule.head.subject: 0, rule.head.object: 1}
    def arg(x): return ids.setdefault(x, len(ids)) if x.startswith("?") else -kg.entity_index(x) - 1
    return rule.head.relation, canon(tuple((a.relation, arg(a.subject), arg(a.object)) for a in rule.body))


def triples_of(kg):
    return [tuple(t) for t in kg.triples.tolist()]


# ---------------------------------------------------------------- hand-built KGs with hand-computed measures
def married():
    return KG.from_triples([("a", "married", "b"), ("b", "married", "a"), ("c", "married", "d")], name="married")


def test_symmetry_measures_by_hand():
    """married(?b,?a) => married(?a,?b): body pairs (b,a), (a,b), (d,c); head facts (a,b), (b,a), (c,d) -> support 2,
    hc 2/3, std 2/3. 3 subjects / 3 facts = 3 objects / 3 facts -> the subject is the functional variable; d has no
    married fact, so the PCA denominator is 2 and PCA confidence 1."""
    kg = married()
    r = rule_measures(kg, parse_amie("?b married ?a => ?a married ?b", kg))
    assert (r.support, r.body_size, r.pca_body_size, r.type) == (2, 3, 2, "symmetry")
    assert r.head_coverage == pytest.approx(2 / 3) and r.std_confidence == pytest.approx(2 / 3)
    assert r.pca_confidence == 1.0
    mined = mine_rules(kg, min_initial_support=1, max_len=2, progress=False)
    assert [m.to_amie(kg) for m in mined] == ["?b married ?a => ?a married ?b"]
    assert (mined[0].support, mined[0].body_size, mined[0].pca_body_size) == (2, 3, 2)


def parents():
    """parent: p1->c1, p1->c2, p1->c3, p2->c1, p2->c2, p3->c4, p4->c6 (4 subjects, 5 objects, 7 facts);
    child: c1->p1, c2->p1, c3->p1, c1->p2, c4->p3, c5->p4 (5 subjects, 4 objects, 6 facts)."""
    par = [("p1", "c1"), ("p1", "c2"), ("p1", "c3"), ("p2", "c1"), ("p2", "c2"), ("p3", "c4"), ("p4", "c6")]
    chi = [("c1", "p1"), ("c2", "p1"), ("c3", "p1"), ("c1", "p2"), ("c4", "p3"), ("c5", "p4")]
    return KG.from_triples([(s, "parent", o) for s, o in par] + [(s, "child", o) for s, o in chi], name="parents")


def test_inversion_and_functional_variable_by_hand():
    kg = parents()
    # parent: functionality 4/7 < inverse functionality 5/7 -> AMIE counts on the object ?b.
    # child(?b,?a) => parent(?a,?b): body pairs (p1,c1) (p1,c2) (p1,c3) (p2,c1) (p3,c4) (p4,c5); support 5 (not (p4,c5));
    # PCA keeps pairs whose ?b is a parent object: drops (p4,c5) -> 5/5 (counting on ?a would give 5/6)
    r = rule_measures(kg, parse_amie("?b child ?a => ?a parent ?b", kg))
    assert (r.support, r.body_size, r.pca_body_size, r.type) == (5, 6, 5, "inversion")
    assert r.head_coverage == pytest.approx(5 / 7) and r.std_confidence == pytest.approx(5 / 6) and r.pca_confidence == 1.0
    # child: functionality 5/6 >= inverse 4/6 -> counts on ?a. parent(?b,?a) => child(?a,?b): body pairs
    # (c1,p1) (c2,p1) (c3,p1) (c1,p2) (c2,p2) (c4,p3) (c6,p4); support 5; PCA drops (c6,p4): c6 is no child subject
    r = rule_measures(kg, parse_amie("?b parent ?a => ?a child ?b", kg))
    assert (r.support, r.body_size, r.pca_body_size) == (5, 7, 6)
    assert r.head_coverage == pytest.approx(5 / 6) and r.std_confidence == pytest.approx(5 / 7)
    assert r.pca_confidence == pytest.approx(5 / 6)
    mined = {m.to_amie(kg): m for m in mine_rules(kg, min_initial_support=1, max_len=2, progress=False)}
    assert set(mined) == {"?b child ?a => ?a parent ?b", "?b parent ?a => ?a child ?b"}
    assert mined["?b child ?a => ?a parent ?b"].pca_body_size == 5


def grandparents(extra=()):
    return KG.from_triples([("g", "parent", "p"), ("p", "parent", "c"), ("g", "parent", "q"), ("q", "parent", "d"),
                            ("h", "parent", "r"), ("r", "parent", "e"),
                            ("g", "grandparent", "c"), ("g", "grandparent", "d"), ("h", "grandparent", "e"),
                            ("x", "grandparent", "y"), *extra], name="grandparents")


COMPOSITION = "?a parent ?c ?c parent ?b => ?a grandparent ?b"


def test_composition_and_head_coverage_pruning_by_hand():
    """parent(?a,?c) & parent(?c,?b) => grandparent(?a,?b): body pairs (g,c), (g,d), (h,e), all grandparent facts;
    4 grandparent facts -> support 3, hc 3/4, std 1, PCA 1."""
    kg = grandparents()
    rules = {r.to_amie(kg): r for r in mine_rules(kg, min_initial_support=1, max_len=3, progress=False)}
    r = rules[COMPOSITION]
    assert (r.support, r.body_size, r.pca_body_size, r.type) == (3, 3, 3, "composition")
    assert (r.head_coverage, r.std_confidence, r.pca_confidence) == (0.75, 1.0, 1.0)
    # head coverage 0.75: kept at min_hc 0.75 (AMIE keeps support >= min_hc * |head|), pruned at 0.8
    assert COMPOSITION in {x.to_amie(kg) for x in mine_rules(kg, min_initial_support=1, max_len=3, min_hc=0.75, progress=False)}
    assert COMPOSITION not in {x.to_amie(kg) for x in mine_rules(kg, min_initial_support=1, max_len=3, min_hc=0.8, progress=False)}
    # min_support: support 3 passes 3, fails 4
    assert COMPOSITION in {x.to_amie(kg) for x in mine_rules(kg, min_initial_support=1, max_len=3, min_support=3, progress=False)}
    assert COMPOSITION not in {x.to_amie(kg) for x in mine_rules(kg, min_initial_support=1, max_len=3, min_support=4, progress=False)}


def skyline_kg():
    """r1: 1-2 3-4 5-6 7-8 9-10; r2: 1-2 3-4 9-10; r3: 1-2 3-4 5-6 7-8 13-14;
    h: 1-2 3-4 5-6 7-8 11-12 9-99 13-98 (7 subjects, 7 objects, 7 facts: PCA counts on the subject)."""
    pairs = {"r1": [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10)], "r2": [(1, 2), (3, 4), (9, 10)],
             "r3": [(1, 2), (3, 4), (5, 6), (7, 8), (13, 14)],
             "h": [(1, 2), (3, 4), (5, 6), (7, 8), (11, 12), (9, 99), (13, 98)]}
    return KG.from_triples([(str(s), r, str(o)) for r, ps in pairs.items() for s, o in ps], name="skyline")


def test_rule_pruned_because_it_does_not_improve_on_its_parent():
    """r1 => h: support 4, PCA 4/5 = 0.8. r2 => h: support 2, PCA 2/3. r1 & r2 => h: body (1,2) (3,4) (9,10), support 2,
    PCA 2/3: passes min_pca 0.3 but does not beat r1 => h (0.8) nor r2 => h (2/3): not output.
    r1 & r3 => h: body (1,2) (3,4) (5,6) (7,8), PCA 4/4 = 1 > 0.8: output. r1 & r2 & r3 => h: PCA 1, not above r1 & r3."""
    kg = skyline_kg()
    rules = {r.to_amie(kg): r for r in mine_rules(kg, min_initial_support=1, max_len=4, progress=False)}
    assert rules["?a r1 ?b => ?a h ?b"].pca_confidence == pytest.approx(0.8)
    assert rules["?a r2 ?b => ?a h ?b"].pca_confidence == pytest.approx(2 / 3)
    both = parse_amie("?a r1 ?b ?a r2 ?b => ?a h ?b", kg)
    assert rule_measures(kg, both).pca_confidence == pytest.approx(2 / 3)  # passes the threshold ...
    assert both.to_amie(kg) not in rules  # ... but does not improve on its parents
    assert rules["?a r1 ?b ?a r3 ?b => ?a h ?b"].pca_confidence == 1.0
    assert rules["?a r1 ?b ?a r3 ?b => ?a h ?b"].type == "other"
    assert classify_rule(rules["?a r1 ?b ?a r3 ?b => ?a h ?b"], detailed=True) == "other:intersection"
    assert "?a r1 ?b ?a r2 ?b ?a r3 ?b => ?a h ?b" not in rules
    assert rule_measures(kg, parse_amie("?a r1 ?b ?a r2 ?b ?a r3 ?b => ?a h ?b", kg)).pca_confidence == 1.0


def test_instantiated_atoms():
    """knows(?a,?b) => friend(?a,?b): support 3, PCA 3/4 (d knows e, d has a friend z). With the constant atom
    citizen(?a, usa) the body keeps a, b, c only: PCA 3/3."""
    t = [("a", "knows", "b"), ("b", "knows", "c"), ("c", "knows", "a"), ("d", "knows", "e"), ("e", "knows", "d"),
         ("a", "friend", "b"), ("b", "friend", "c"), ("c", "friend", "a"), ("d", "friend", "z"),
         ("a", "citizen", "usa"), ("b", "citizen", "usa"), ("c", "citizen", "usa")]
    kg = KG.from_triples(t, name="citizens")
    text = "?a citizen usa ?a knows ?b => ?a friend ?b"
    with_c = {r.to_amie(kg): r for r in mine_rules(kg, min_initial_support=1, max_len=3, instantiated=True, progress=False)}
    assert text in with_c
    r = with_c[text]
    assert (r.support, r.body_size, r.pca_body_size, r.pca_confidence) == (3, 3, 3, 1.0)
    assert classify_rule(r, detailed=True) == "other:instantiated"
    assert with_c["?a knows ?b => ?a friend ?b"].pca_confidence == pytest.approx(0.75)
    assert rule_measures(kg, parse_amie(text, kg)).pca_confidence == 1.0
    assert brute_measures(triples_of(kg), *encode(kg, r)) == (3, 3, 3)
    assert text not in {x.to_amie(kg) for x in mine_rules(kg, min_initial_support=1, max_len=3, progress=False)}
    gs = groundings(kg, r)
    assert [kg.entities[g.binding["?a"]] for g in gs] == ["a", "b", "c"]
    assert all(g.body[0][2] == kg.entity_index("usa") for g in gs)


# ---------------------------------------------------------------- groundings
def test_groundings_by_hand():
    kg = grandparents()
    rule = parse_amie(COMPOSITION, kg)
    e, rel = kg.entity_index, kg.relation_index
    gs = groundings(kg, rule)
    assert [(kg.entities[g.head[0]], kg.entities[g.head[2]]) for g in gs] == [("g", "c"), ("g", "d"), ("h", "e")]
    assert gs[0] == Grounding((e("g"), rel("grandparent"), e("c")),
                              ((e("g"), rel("parent"), e("p")), (e("p"), rel("parent"), e("c"))),
                              {"?a": e("g"), "?b": e("c"), "?c": e("p")})
    for g in gs:  # every body and head triple is a fact
        assert all(kg.contains(*t) for t in g.body + (g.head,))
    assert groundings(kg, rule, head_present=False) == []
    kg2 = grandparents(extra=[("p", "parent", "z"), ("p", "parent", "w")])
    pred = groundings(kg2, parse_amie(COMPOSITION, kg2), head_present=False)
    assert sorted(kg2.entities[g.binding["?b"]] for g in pred) == ["w", "z"]
    assert not any(kg2.contains(*g.head) for g in pred)
    assert len(groundings(kg2, parse_amie(COMPOSITION, kg2), head_present=None)) == 5
    # limit draws a seeded random subset; the same seed gives the same subset
    some = groundings(kg2, parse_amie(COMPOSITION, kg2), limit=2, seed=3, head_present=None)
    assert len(some) == 2 and some == groundings(kg2, parse_amie(COMPOSITION, kg2), limit=2, seed=3, head_present=None)
    assert set(map(str, some)) <= set(map(str, groundings(kg2, parse_amie(COMPOSITION, kg2), head_present=None)))
    assert {tuple(map(str, groundings(kg2, parse_amie(COMPOSITION, kg2), limit=1, seed=s, head_present=None)))
            for s in range(30)}.__len__() > 1
    with pytest.raises(ValueError, match="limit"):
        groundings(kg, rule, limit=-1)


def test_groundings_with_a_tiny_row_budget_are_the_same():
    kg = grandparents(extra=[("p", "parent", "z"), ("p", "parent", "w")])
    rule = parse_amie(COMPOSITION, kg)
    assert groundings(kg, rule, head_present=None, max_rows=1) == groundings(kg, rule, head_present=None)


# ---------------------------------------------------------------- notation, TSV, CLI
def test_parse_and_format():
    kg = parents()
    r = parse_amie("?x  child  ?z   => ?z  parent  ?x", kg)  # AMIE's own spacing and other variable names
    assert r.to_amie(kg) == "?b child ?a => ?a parent ?b"
    assert r.head == Atom(kg.relation_index("parent"), "?a", "?b") and math.isnan(r.support)
    assert parse_amie("?b child ?c ?c parent ?a => ?a parent ?b", kg) == \
           parse_amie("?b child ?x ?x parent ?a => ?a parent ?b", kg)
    for bad, msg in [("?a parent ?b", "=>"), ("?a parent => ?a parent ?b", "triples"),
                     ("?a parent ?a => ?a parent ?a", "distinct"), ("?a nope ?b => ?a parent ?b", "nope"),
                     ("?a parent nobody => ?a parent ?b", "nobody")]:
        with pytest.raises((ValueError, KeyError), match=msg):
            parse_amie(bad, kg)


def test_tsv_roundtrip_and_columns(tmp_path):
    kg = grandparents()
    rules = mine_rules(kg, min_initial_support=1, max_len=3, progress=False)
    path = write_rules_tsv(rules, kg, tmp_path / "out" / "rules.tsv")
    df = pd.read_csv(path, sep="\t")
    assert df.columns.tolist() == list(TSV_COLUMNS) and len(df) == len(rules)
    back = read_rules_tsv(path, kg)
    assert back == rules
    assert [(b.support, b.body_size, b.pca_body_size, b.type) for b in back] == \
           [(r.support, r.body_size, r.pca_body_size, r.type) for r in rules]
    assert [b.pca_confidence for b in back] == pytest.approx([r.pca_confidence for r in rules])
    (tmp_path / "bad.tsv").write_text("rule\tsupport\n?a parent ?b => ?a grandparent ?b\t3\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_rules_tsv(tmp_path / "bad.tsv", kg)


def test_cli_mines_a_tsv(tmp_path, capsys):
    from kgrag_nb.cli import main
    kg = grandparents()
    src = tmp_path / "kg.tsv"
    kg.to_dataframe().to_csv(src, sep="\t", index=False, header=False)
    out = tmp_path / "rules.tsv"
    assert main(["rules", "mine", str(src), "--max-len", "3", "--min-hc", "0.1", "--min-pca", "0.3",
                 "--min-support", "2", "--min-initial-support", "1", "--out", str(out), "--quiet"]) == 0
    assert "rules in" in capsys.readouterr().out
    kg2 = load_kg_or_tsv(str(src))
    expected = {r.to_amie(kg) for r in mine_rules(kg, min_initial_support=1, max_len=3, progress=False)}
    assert {r.to_amie(kg2) for r in read_rules_tsv(out, kg2)} == expected
    with pytest.raises(ValueError, match="neither a file"):
        load_kg_or_tsv(str(tmp_path / "missing.tsv"))
    (tmp_path / "two.tsv").write_text("a\tb\n")
    with pytest.raises(ValueError, match="3 tab-separated columns"):
        load_kg_or_tsv(str(tmp_path / "two.tsv"))
    # --amie-compat 2019 reaches the miner: at length 4 it leaves out 4 of this KG's 7 rules, e.g.
    # ?a grandparent ?c ?d parent ?b ?d parent ?c => ?a grandparent ?b (4 atoms, each relation twice)
    out4 = tmp_path / "rules4.tsv"
    assert main(["rules", "mine", str(src), "--max-len", "4", "--min-initial-support", "1", "--amie-compat", "2019",
                 "--out", str(out4), "--quiet"]) == 0
    got4 = {r.to_amie(kg2) for r in read_rules_tsv(out4, kg2)}
    every4 = {r.to_amie(kg) for r in mine_rules(kg, max_len=4, min_initial_support=1, progress=False)}
    assert len(every4) == 7 and len(got4) == 3 and got4 < every4
    assert "?a grandparent ?c ?d parent ?b ?d parent ?c => ?a grandparent ?b" in every4 - got4
    # AMIE's default -minis 100: every relation of this KG has fewer facts, so no rule
    assert main(["rules", "mine", str(src), "--max-len", "3", "--out", str(tmp_path / "none.tsv"), "--quiet"]) == 0
    assert pd.read_csv(tmp_path / "none.tsv", sep="\t").empty


@pytest.mark.parametrize("text,line,what", [
    ("a\tr\tb\nc\tr\n", 2, "found 2 field"),  # ragged: would create an empty-string entity
    ("head\trelation\ttail\na\tr\tb\tx\n", 2, "found 4 field"),
    ("a\tr\tb\n\tr\tc\n", 2, "one empty"),
    ("a\tr\tb\r\nc\tr\r\n", 2, "found 2 field")])
def test_tsv_refuses_ragged_lines_with_file_and_line(tmp_path, text, line, what):
    """Issue 10, defect 7: `kgrag rules mine` accepted ragged lines (a 2-field line made an empty-string entity)."""
    path = tmp_path / "kg.tsv"
    path.write_bytes(text.encode())
    with pytest.raises(ValueError, match=rf"kg\.tsv, line {line}: .*{what}"):
        load_kg_or_tsv(str(path))


def test_tsv_refuses_empty_and_non_utf8_files(tmp_path):
    for name, data in [("empty.tsv", b""), ("header.tsv", b"head\trelation\ttail\n"), ("blank.tsv", b"\n\n")]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=rf"{name}: no triples"):
            load_kg_or_tsv(str(tmp_path / name))
    (tmp_path / "latin1.tsv").write_bytes("caf\xe9\tr\tb\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.tsv: not UTF-8"):
        load_kg_or_tsv(str(tmp_path / "latin1.tsv"))
    (tmp_path / "ok.tsv").write_bytes(b"a\tr\tb\n\nc\tr\td\n")  # blank lines are skipped
    assert load_kg_or_tsv(str(tmp_path / "ok.tsv")).num_triples == 2


def test_bad_arguments():
    kg = grandparents()
    for kw, msg in [(dict(max_len=1), "max_len"), (dict(min_hc=1.5), "min_hc"), (dict(min_pca=-0.1), "min_pca"),
                    (dict(min_support=-1), "min_support"), (dict(min_initial_support=-1), "min_initial_support"),
                    (dict(amie_compat="2020"), "amie_compat"), (dict(amie_compat=2019), "amie_compat")]:
        with pytest.raises(ValueError, match=msg):
            mine_rules(kg, progress=False, **kw)
    with pytest.raises(ValueError, match="two distinct variables"):
        rule_measures(kg, Rule(Atom(0, "?a", "?a"), (Atom(1, "?a", "?b"),)))


def test_time_limit():
    kg = load_kg_or_tsv("family")
    with pytest.raises(TimeoutError, match="time limit"):
        mine_rules(kg, min_initial_support=1, max_len=4, time_limit=1e-9, progress=False)


# ---------------------------------------------------------------- classifier
@pytest.mark.parametrize("body,expected", [
    ([(0, "?b", "?a")], "symmetry"), ([(1, "?b", "?a")], "inversion"), ([(1, "?a", "?b")], "hierarchy"),
    ([(1, "?a", "?c"), (2, "?c", "?b")], "composition"), ([(0, "?a", "?c"), (0, "?c", "?b")], "composition"),
    ([(1, "?c", "?a"), (2, "?c", "?b")], "other:triangle"), ([(1, "?b", "?c"), (2, "?c", "?a")], "other:triangle"),
    ([(1, "?a", "?c"), (2, "?d", "?c"), (3, "?d", "?b")], "other:longer_chain"),
    ([(1, "?a", "?b"), (2, "?a", "?b")], "other:intersection"),
    ([(1, "?a", "?c"), (2, "?c", "?b"), (3, "?a", "?b")], "other:misc"),
    ([(0, "?a", "?c"), (1, "?c", "?b"), (2, "?b", "?a")], "other:recursive"),
    ([(1, "?a", "?b"), (2, "?b", "x")], "other:instantiated")])
def test_classify(body, expected):
    rule = Rule(Atom(0, "?a", "?b"), tuple(Atom(*a) for a in body))
    assert classify_rule(rule, detailed=True) == expected
    assert classify_rule(rule) == expected.split(":")[0]


# ---------------------------------------------------------------- property tests against brute force
@st.composite
def small_kgs(draw, max_triples=16):
    n_ent = draw(st.integers(2, 5))
    n_rel = draw(st.integers(1, 3))
    t = draw(st.lists(st.tuples(st.integers(0, n_ent - 1), st.integers(0, n_rel - 1), st.integers(0, n_ent - 1)),
                      min_size=1, max_size=max_triples))
    return KG.from_arrays(np.array(t), [f"e{i}" for i in range(n_ent)], [f"r{i}" for i in range(n_rel)])


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(kg=small_kgs(), min_hc=st.sampled_from([0.0, 0.1, 0.5]), min_pca=st.sampled_from([0.0, 0.3, 0.6]),
       min_support=st.sampled_from([1, 2]), max_rows=st.sampled_from([1, 7, 4_000_000]),
       min_initial_support=st.sampled_from([0, 1, 4, 7]))
def test_mining_matches_brute_force_length_3(kg, min_hc, min_pca, min_support, max_rows, min_initial_support):
    got = mine_rules(kg, min_initial_support=min_initial_support, max_len=3, min_hc=min_hc, min_pca=min_pca,
                     min_support=min_support, progress=False, max_rows=max_rows)
    exp = brute_mine(triples_of(kg), kg.num_relations, 3, min_hc, min_pca, min_support,
                     min_initial_support=min_initial_support)
    assert {encode(kg, r): (r.support, r.body_size, r.pca_body_size) for r in got} == exp
    for r in got:
        n_head = int((kg.triples[:, 1] == r.head.relation).sum())
        assert 0 <= r.std_confidence <= r.pca_confidence <= 1
        assert 0 < r.support <= n_head and r.head_coverage == r.support / n_head
        assert r.support <= r.pca_body_size <= r.body_size
        assert r.pca_confidence >= min_pca and r.head_coverage >= min_hc and r.support >= min_support


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kg=small_kgs(max_triples=22), min_std=st.sampled_from([0.0, 0.4]), amie_compat=st.sampled_from([None, "2019"]))
def test_mining_matches_brute_force_length_4(kg, min_std, amie_compat):
    got = mine_rules(kg, min_initial_support=1, max_len=4, min_hc=0.1, min_pca=0.3, min_support=1, min_std=min_std,
                     progress=False, amie_compat=amie_compat)
    exp = brute_mine(triples_of(kg), kg.num_relations, 4, 0.1, 0.3, 1, min_std=min_std, amie_compat=amie_compat)
    assert {encode(kg, r): (r.support, r.body_size, r.pca_body_size) for r in got} == exp


@SETTINGS
@given(kg=small_kgs(), data=st.data())
def test_rule_measures_match_brute_force(kg, data):
    """Any closed connected body (and one with a constant) against brute-force measures."""
    bodies = list(all_bodies(range(kg.num_relations), 3))
    body = data.draw(st.sampled_from(bodies))
    if data.draw(st.booleans()):  # add an instantiated atom on ?a
        body = body + ((data.draw(st.integers(0, kg.num_relations - 1)), 0, -data.draw(st.integers(0, kg.num_entities - 1)) - 1),)
    h = data.draw(st.integers(0, kg.num_relations - 1))
    if not (kg.triples[:, 1] == h).any(): return
    name = lambda x: f"?{'abcd'[x]}" if x >= 0 else kg.entities[-x - 1]
    rule = Rule(Atom(h, "?a", "?b"), tuple(Atom(r, name(s), name(o)) for r, s, o in body))
    m = rule_measures(kg, rule, max_rows=data.draw(st.sampled_from([1, 4_000_000])))
    s, bs, pb = brute_measures(triples_of(kg), h, body)
    assert (m.support, m.body_size, m.pca_body_size) == (s, bs, pb)
    assert m.support <= int((kg.triples[:, 1] == h).sum())
    if s: assert 0 < m.std_confidence <= m.pca_confidence <= 1
    # groundings: every substitution with all body atoms (and the head) true, checked by enumeration
    gs = groundings(kg, rule, head_present=None)
    facts = set(triples_of(kg))
    assert len(gs) == len({tuple(sorted(g.binding.items())) for g in gs})
    assert all(t in facts for g in gs for t in g.body)
    assert len({(g.head[0], g.head[2]) for g in gs}) == bs
    assert len({(g.head[0], g.head[2]) for g in groundings(kg, rule)}) == s


# ---------------------------------------------------------------- AMIE's -minis and the pre-2020 output filter
def likes():
    """likes: a->b, b->c, c->d, d->e, e->a (5 facts); liked_by: b->a, c->b, d->c, e->d (4 facts, the inverse of the
    first four likes facts)."""
    t = [(s, "likes", o) for s, o in ["ab", "bc", "cd", "de", "ea"]] + [(s, "liked_by", o) for s, o in ["ba", "cb", "dc", "ed"]]
    return KG.from_triples(t, name="likes")


def test_head_relation_below_min_initial_support_gives_no_rules():
    """liked_by(?b,?a) => likes(?a,?b): body pairs (a,b) (b,c) (c,d) (d,e), all likes facts: support 4, hc 4/5.
    likes(?b,?a) => liked_by(?a,?b): body pairs (b,a) (c,b) (d,c) (e,d) (a,e): support 4, hc 4/4.
    AMIE's -minis keeps head relations with at least that many facts: likes has 5, liked_by 4."""
    kg = likes()
    heads = lambda minis: sorted(kg.relations[r.head.relation] for r in mine_rules(kg, max_len=2, progress=False,
                                                                                  min_initial_support=minis))
    assert heads(1) == heads(4) == ["liked_by", "likes"]  # >= 4 facts: both
    assert heads(5) == ["likes"]  # liked_by (4 facts) is below 5: no rule with that head
    assert heads(6) == [] and mine_rules(kg, max_len=2, progress=False) == []  # AMIE's default 100
    r = {x.to_amie(kg): x for x in mine_rules(kg, max_len=2, progress=False, min_initial_support=1)}
    assert (r["?b liked_by ?a => ?a likes ?b"].support, r["?b liked_by ?a => ?a likes ?b"].head_coverage) == (4, 0.8)
    assert (r["?b likes ?a => ?a liked_by ?b"].support, r["?b likes ?a => ?a liked_by ?b"].head_coverage) == (4, 1.0)
    # the rules of the other head relation are untouched: the option is a filter on head relations
    every = mine_rules(kg, max_len=3, progress=False, min_initial_support=1)
    assert mine_rules(kg, max_len=3, progress=False, min_initial_support=5) == amie_filters(every, kg, 5) == \
           [x for x in every if kg.relations[x.head.relation] == "likes"]


def hand_rule(*atoms, head="h"):
    "A rule with head `head(?a, ?b)` from (subject, relation, object) atoms; relations are names."
    rel = {name: i for i, name in enumerate(dict.fromkeys([head] + [a[1] for a in atoms]))}
    return Rule(Atom(rel[head], "?a", "?b"), tuple(Atom(rel[r], s, o) for s, r, o in atoms))


@pytest.mark.parametrize("atoms,dropped", [
    ((("?a", "r", "?c"), ("?c", "r", "?d"), ("?d", "h", "?b")), True),  # 4 atoms: h twice, r twice
    ((("?a", "r", "?c"), ("?c", "s", "?d"), ("?d", "h", "?b")), False),  # r, s once each
    ((("?a", "r", "?b"), ("?b", "r", "?a"), ("?a", "s", "?b")), False),  # 4 atoms: r twice, h and s once
    ((("?a", "h", "?c"), ("?c", "h", "?b")), False),  # 3 atoms (odd)
    ((("?b", "h", "?a"),), False),  # 2 atoms: h twice but shorter than 4
    ((("?a", "r", "?c"), ("?c", "r", "?d"), ("?d", "h", "?e")), False),  # ?b and ?e occur once: not closed
    ((("?a", "r", "?c"), ("?c", "r", "?d"), ("?d", "s", "?e"), ("?e", "s", "?f"), ("?f", "h", "?b")), True),  # 6 atoms
    ((("?a", "r", "?c"), ("?c", "r", "?d"), ("?d", "r", "?e"), ("?e", "s", "?f"), ("?f", "h", "?b")), False),  # r 3x
])
def test_amie_2019_filter_on_hand_made_rules(atoms, dropped):
    assert amie_2019_dropped(hand_rule(*atoms)) is dropped


def test_amie_2019_filter_hand_counted_case_with_head_in_body():
    # ?a r ?b, ?b r ?a, ?a h ?b => ?a h ?b has 4 atoms, r twice and h twice: dropped (AMIE would not build it: the body
    # repeats the head atom; the filter itself only counts relations)
    assert amie_2019_dropped(hand_rule(("?a", "r", "?b"), ("?b", "r", "?a"), ("?b", "h", "?a")))


@st.composite
def hand_rules(draw):
    "Random connected rules over ?a, ?b and up to 3 fresh variables, 1-5 body atoms, relations 0-2."
    n = draw(st.integers(1, 5))
    names = ["?a", "?b", "?c", "?d", "?e"]
    body = tuple(Atom(draw(st.integers(0, 2)), draw(st.sampled_from(names)), draw(st.sampled_from(names))) for _ in range(n))
    return Rule(Atom(draw(st.integers(0, 2)), "?a", "?b"), body)


@SETTINGS
@given(rule=hand_rules(), data=st.data())
def test_amie_2019_filter_properties(rule, data):
    dropped = amie_2019_dropped(rule)
    if rule.length % 2 or rule.length < 4: assert not dropped  # odd or short rules always pass
    # invariant under reordering the body and renaming relations bijectively
    perm = data.draw(st.permutations(list(rule.body)))
    ren = dict(zip(range(3), data.draw(st.permutations([0, 1, 2]))))
    moved = Rule(Atom(ren[rule.head.relation], "?a", "?b"), tuple(Atom(ren[a.relation], a.subject, a.object) for a in perm))
    assert amie_2019_dropped(moved) == dropped
    # a dropped rule has exactly two atoms of each of its relations: adding one more atom of one of them rescues it
    if dropped:
        extra = Atom(rule.head.relation, "?a", "?b")
        assert not amie_2019_dropped(Rule(rule.head, rule.body + (extra,)))
        assert not amie_2019_dropped(Rule(rule.head, rule.body + (extra, extra)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kg=small_kgs(max_triples=20), minis=st.sampled_from([1, 3, 5, 8]), compat=st.sampled_from([None, "2019"]))
def test_options_are_filters_of_the_complete_run(kg, minis, compat):
    "Both options equal post-filters of a min_initial_support=1 run (what the study notebook and bench rely on)."
    every = mine_rules(kg, max_len=4, min_support=1, progress=False, min_initial_support=1)
    got = mine_rules(kg, max_len=4, min_support=1, progress=False, min_initial_support=minis, amie_compat=compat)
    assert got == amie_filters(every, kg, minis, compat)
    sizes = np.bincount(kg.triples[:, 1], minlength=kg.num_relations)
    assert all(sizes[r.head.relation] >= minis for r in got)
    if compat is None: assert set(got) == {r for r in every if sizes[r.head.relation] >= minis}


# ---------------------------------------------------------------- real data: Family against BRINK Table 1
def test_family_reproduces_brink_table1():
    """BRINK App. A.2: Family mined at length 3 with standard confidence 0.3, PCA confidence 0.4 (head coverage 0.1):
    Table 1 lists 145 rules, 0 symmetry, 6 inversion, 0 hierarchy, 56 composition, 83 other."""
    kg = load_kg_or_tsv("family")
    assert kg.num_triples == 17_615
    rules = mine_rules(kg, max_len=3, progress=False, **APP_A2)
    assert {**_by_type(rules), "total": len(rules)} == brink_table1("family")
    assert all(r.std_confidence >= 0.3 and r.pca_confidence >= 0.4 and r.head_coverage >= 0.1 for r in rules)
    for r in rules[:20]:  # spot check the vectorised measures against a from-scratch computation
        m = rule_measures(kg, r)
        assert (m.support, m.body_size, m.pca_body_size) == (r.support, r.body_size, r.pca_body_size)
    # the output test does not depend on the thresholds: the stricter run is the looser run filtered
    loose = mine_rules(kg, max_len=3, progress=False)
    assert len(loose) == 239  # AMIE's default min_initial_support 100 changes nothing: Family's smallest relation has 711 facts
    assert int(np.bincount(kg.triples[:, 1]).min()) == 711
    assert amie_filters(loose, kg, amie_compat="2019") == loose  # the 2019 filter needs 4 or more atoms
    assert set(rules) == {r for r in loose if r.std_confidence >= 0.3 and r.pca_confidence >= 0.4}


def test_family_parallel_equals_sequential(monkeypatch):
    import kgrag_nb.studies.brink.rules as rules_mod
    monkeypatch.setattr(rules_mod, "MIN_PARALLEL_ITEMS", 1)  # send every level to the worker processes
    kg = load_kg_or_tsv("family")
    seq = mine_rules(kg, max_len=3, progress=False)
    par = mine_rules(kg, max_len=3, progress=False, n_jobs=2)
    assert par == seq and [r.pca_body_size for r in par] == [r.pca_body_size for r in seq]


@pytest.mark.slow
def test_family_length_4_amie_2019():
    """Family, length 4, hc 0.1, PCA 0.3, support 1, min_initial_support 1: 3,245 rules; AMIE builds before April 2020
    output 2,732 distinct rules. The 2019 filter removes 511 of the 513 extra rules: 2,734 = AMIE's 2,732 plus the 2
    rules AMIE's false-positive subsumption test drops (a bug not copied; see the study's `STUDY.deviations["rules"]`)."""
    kg = load_kg_or_tsv("family")
    every = mine_rules(kg, max_len=4, min_hc=0.1, min_pca=0.3, min_support=1, progress=False, min_initial_support=1)
    assert len(every) == 3245
    compat = mine_rules(kg, max_len=4, min_hc=0.1, min_pca=0.3, min_support=1, progress=False, min_initial_support=1,
                        amie_compat="2019")
    assert len(compat) == 2734 and compat == amie_filters(every, kg, 1, "2019")
    dropped = [r for r in every if amie_2019_dropped(r)]
    assert len(dropped) == 511 and all(r.length == 4 for r in dropped)


# ---------------------------------------------------------------- the rules cache (mine once per KG and options)
CACHE_OPTS = dict(max_len=3, min_hc=0.1, min_pca=0.3, min_std=0.0, min_support=2, instantiated=False, recursivity_limit=3)


def test_rules_cache_reuses_without_mining(tmp_path, monkeypatch):
    """Same KG and options: the second call reads the stored rules (mine_rules is not called), measures and order
    identical; min_initial_support and amie_compat are filters of the one stored run, so they share the entry."""
    import kgrag_nb.studies.brink.rules as R
    kg = likes()
    calls = []
    real = R.mine_rules
    monkeypatch.setattr(R, "mine_rules", lambda *a, **k: calls.append(k) or real(*a, **k))
    first = R.mine_rules_cached(kg, progress=False, min_initial_support=1, cache_dir=tmp_path, **CACHE_OPTS)
    assert len(calls) == 1 and calls[0]["min_initial_support"] == 1 and first.cache["reused"] is False
    assert "stored in cache " + first.cache["key"][:16] in first.cache_note
    monkeypatch.setattr(R, "mine_rules", lambda *a, **k: pytest.fail("mined again although the key is cached"))
    again = R.mine_rules_cached(kg, progress=False, min_initial_support=1, cache_dir=tmp_path, **CACHE_OPTS)
    assert again.cache["reused"] is True and again.cache["key"] == first.cache["key"]
    assert again.cache_note.startswith(f"mined rules reused from cache {first.cache['key'][:16]}")
    assert [(r.to_amie(kg), r.support, r.head_coverage, r.std_confidence, r.pca_confidence, r.body_size, r.pca_body_size, r.type)
            for r in again] == [(r.to_amie(kg), r.support, r.head_coverage, r.std_confidence, r.pca_confidence, r.body_size,
                                 r.pca_body_size, r.type) for r in first]
    assert again == real(kg, progress=False, min_initial_support=1, **CACHE_OPTS)
    five = R.mine_rules_cached(kg, progress=False, min_initial_support=5, cache_dir=tmp_path, **CACHE_OPTS)
    assert five.cache["reused"] and five == real(kg, progress=False, min_initial_support=5, **CACHE_OPTS) \
        and [kg.relations[r.head.relation] for r in five] == ["likes"] * len(five) and len(five) < len(first)
    # one folder, complete, no temporary left behind
    assert [p.name for p in tmp_path.iterdir()] == [first.cache["key"][:16]]
    assert sorted(p.name for p in (tmp_path / first.cache["key"][:16]).iterdir()) == ["meta.json", "rules.tsv"]


@pytest.mark.parametrize("option,value", [("max_len", 2), ("min_hc", 0.2), ("min_pca", 0.4), ("min_std", 0.3),
                                          ("min_support", 3), ("instantiated", True), ("recursivity_limit", 2)])
def test_rules_cache_key_changes_with_every_option(option, value):
    from kgrag_nb.studies.brink.rules import rules_cache_key
    kg = likes()
    assert rules_cache_key(kg, **CACHE_OPTS) == rules_cache_key(kg, **CACHE_OPTS)  # deterministic
    assert rules_cache_key(kg, **{**CACHE_OPTS, option: value}) != rules_cache_key(kg, **CACHE_OPTS)


def test_rules_cache_key_changes_with_the_kg_and_the_code(monkeypatch):
    import kgrag_nb.studies.brink.rules as R
    kg = likes()
    key = R.rules_cache_key(kg, **CACHE_OPTS)
    fewer = KG.from_arrays(kg.triples[1:], kg.entities, kg.relations)  # one triple less
    renamed = KG.from_arrays(kg.triples, [e + "_" for e in kg.entities], kg.relations)  # same numbers, other ids
    assert len({key, R.rules_cache_key(fewer, **CACHE_OPTS), R.rules_cache_key(renamed, **CACHE_OPTS)}) == 3
    assert R.rules_cache_key(KG.from_arrays(kg.triples, kg.entities, kg.relations, name="other"), **CACHE_OPTS) == key  # name: no
    monkeypatch.setattr(R, "_rules_code_version", lambda: "0" * 64)
    assert R.rules_cache_key(kg, **CACHE_OPTS) != key
    with pytest.raises(ValueError, match="missing"): R.rules_cache_key(kg, max_len=3)


def test_rules_cache_second_writer_keeps_the_first_folder(tmp_path, monkeypatch):
    """A process that finishes mining after another one stored the same key leaves the stored folder as it is."""
    import kgrag_nb.studies.brink.rules as R
    kg = likes()
    first = R.mine_rules_cached(kg, progress=False, min_initial_support=1, cache_dir=tmp_path, **CACHE_OPTS)
    folder = tmp_path / first.cache["key"][:16]
    before = (folder / "meta.json").read_text()
    R._write_cached(folder, list(first)[:1], kg, {"key": first.cache["key"], "rules": 1, "mining_s": 0})
    assert (folder / "meta.json").read_text() == before and [p.name for p in tmp_path.iterdir()] == [folder.name]
    (folder / "rules.tsv").write_text((folder / "rules.tsv").read_text().splitlines()[0] + "\n")  # truncated by hand
    with pytest.raises(ValueError, match="delete the folder"):
        R.mine_rules_cached(kg, progress=False, min_initial_support=1, cache_dir=tmp_path, **CACHE_OPTS)


# ---------------------------------------------------------------- _refine's steps, each by hand (issue 24)
def test_refinement_ops_by_hand():
    from kgrag_nb.studies.brink.rules import _refinement_ops
    # ⊤ => h(?a, ?b), length 2: only a closing atom can still close; length 3: dangling on ?a or ?b either way, too
    assert _refinement_ops((), 2, True) == (2, [], [(0, 1), (1, 0)], [])
    assert _refinement_ops((), 3, False) == (2, [(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 1), (1, 0)], [])
    assert _refinement_ops((), 3, True)[3] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # r(?a, ?c) => h(?a, ?b) at length 3: ?b and ?c are open, one atom left: it must join them
    assert _refinement_ops(((5, 0, 2),), 3, True) == (3, [], [(1, 2), (2, 1)], [])
    # at length 4 the same body may still dangle from ?b or ?c (two atoms left), but not from ?a (three open variables)
    nv, dang, clos, inst = _refinement_ops(((5, 0, 2),), 4, False)
    assert nv == 3 and dang == [(1, 0), (1, 1), (2, 0), (2, 1)] and len(clos) == 6


def test_project_reads_head_variables_and_dedups_by_hand():
    from kgrag_nb.studies.brink.rules import _project
    T = {"p": np.array([0, 0, 1, 1]), 2: np.array([7, 8, 7, 7]), 3: np.array([1, 2, 3, 4])}
    hs, ho = np.array([10, 11]), np.array([20, 21])
    pp, (a,) = _project(T, hs, ho, 30, (0,))
    assert pp.tolist() == [0, 1] and a.tolist() == [10, 11]
    pp, (b, c) = _project(T, hs, ho, 30, (1, 2))  # (p, ?b, ?c): head fact 1 has ?c = 7 twice (rows differ on variable 3)
    assert list(zip(pp.tolist(), b.tolist(), c.tolist())) == [(0, 20, 7), (0, 20, 8), (1, 21, 7)]


def test_children_above_threshold_duplicates_and_recursivity_by_hand():
    from kgrag_nb.studies.brink.rules import _children_above
    # head 0, relations 0 and 1: r1(?a, ?c) support 3; r0(?b, ?a) support 2; r0(?a, ?b) is the head atom itself
    got = _children_above(0, (), 2, {(0, 0): np.array([1, 3])}, {(1, 0): np.array([2, 0]), (0, 1): np.array([5, 0])}, {},
                          2, 3, 10)
    assert got == [(((1, 0, 2),), 3), (((0, 1, 0),), 2)]
    assert _children_above(0, (), 2, {(0, 0): np.array([1, 3])}, {}, {}, 4, 3, 10) == []  # below the threshold
    # recursivity_limit 1 forbids a second relation-0 atom; the instantiated key r * E + e = 1 * 10 + 4 is r1(?a, e4)
    got = _children_above(0, (), 2, {}, {(1, 0): np.array([2, 0])}, {(0, 0): [(np.array([14]), np.array([2]))]}, 2, 1, 10)
    assert got == [(((1, 0, -5),), 2)]
