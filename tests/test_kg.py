"""Tests of kgrag_nb.kg: hand-built graphs with hand-computed answers, hypothesis properties against brute-force
reference implementations, and FB15k-237 (real data from the offline mirror) for the 2-hop subgraph cap."""
import tempfile
from collections import deque
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path as cs_shortest_path
from hypothesis import given, settings, strategies as st, HealthCheck

from kgrag_nb.config import get_config
from kgrag_nb.kg import KG, COLUMNS
from kgrag_nb.studies.awakening.task1 import AWAKENING_MAX_SUBGRAPH_TRIPLES


# ---------------------------------------------------------------- hand-built graphs
def star():
    """Hub `h` with spokes; one 2-hop tail and a back edge.

    0 h r1 a | 1 h r1 b | 2 c r2 h | 3 a r2 x | 4 x r1 y | 5 b r1 b (self loop) | 6 z r1 z (isolated self loop)
    entities sorted: a b c h x y z -> 0..6; relations r1, r2 -> 0, 1
    """
    return KG.from_triples([("h", "r1", "a"), ("h", "r1", "b"), ("c", "r2", "h"), ("a", "r2", "x"),
                            ("x", "r1", "y"), ("b", "r1", "b"), ("z", "r1", "z")], name="star")


def test_construction_and_vocab():
    kg = star()
    assert kg.entities.tolist() == ["a", "b", "c", "h", "x", "y", "z"]
    assert kg.relations.tolist() == ["r1", "r2"]
    assert kg.triples.dtype == np.int32 and kg.triples.shape == (7, 3)
    assert kg.triples[2].tolist() == [2, 1, 3]
    assert (kg.num_entities, kg.num_relations, kg.num_triples, len(kg)) == (7, 2, 7, 7)
    assert repr(kg) == "KG('star': 7 triples, 7 entities, 2 relations)"
    with pytest.raises(ValueError):  # immutable
        kg.triples[0, 0] = 1


def test_duplicates_dropped_first_occurrence_kept():
    kg = KG.from_triples([("a", "r", "b"), ("b", "r", "c"), ("a", "r", "b"), ("c", "r", "a"), ("b", "r", "c")])
    assert kg.to_dataframe().values.tolist() == [["a", "r", "b"], ["b", "r", "c"], ["c", "r", "a"]]
    kg2 = KG.from_arrays(np.array([[0, 0, 1], [0, 0, 1]]), ["a", "b"], ["r"])
    assert len(kg2) == 1
    assert len(KG.from_arrays(np.array([[0, 0, 1], [0, 0, 1]]), ["a", "b"], ["r"], dedup=False)) == 2


def test_dataframe_input_and_errors():
    df = pd.DataFrame({"tail": ["b"], "head": ["a"], "relation": ["r"], "extra": [1]})
    assert KG.from_triples(df).to_dataframe().values.tolist() == [["a", "r", "b"]]
    with pytest.raises(ValueError, match="lacks columns"):
        KG.from_triples(pd.DataFrame({"h": ["a"], "r": ["r"], "t": ["b"]}))
    with pytest.raises(ValueError, match="missing values"):
        KG.from_triples(pd.DataFrame({"head": ["a", None], "relation": ["r", "r"], "tail": ["b", "c"]}))
    with pytest.raises(ValueError, match="head, relation, tail"):
        KG.from_triples([("a", "r")])
    with pytest.raises(ValueError, match="out of range"):
        KG.from_arrays([[0, 0, 2]], ["a", "b"], ["r"])
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        KG.from_arrays([[0, 0]], ["a", "b"], ["r"])
    with pytest.raises(ValueError, match="duplicates"):
        KG.from_arrays([[0, 0, 1]], ["a", "a"], ["r"])
    with pytest.raises(KeyError, match="'zz'"):
        KG.from_triples([("a", "r", "zz")], entities=["a", "b"])
    empty = KG.from_triples([], name="empty")
    assert (len(empty), empty.num_entities) == (0, 0)


def test_fixed_vocabulary_keeps_isolated_entities():
    kg = KG.from_triples([("b", "r", "a")], entities=["a", "b", "c"], relations=["q", "r"])
    assert kg.entities.tolist() == ["a", "b", "c"] and kg.triples.tolist() == [[1, 1, 0]]
    assert kg.out_degree.tolist() == [0, 1, 0]


def test_index_errors_name_entity_and_kg():
    kg = star()
    assert kg.entity_index("h") == 3 and kg.relation_index("r2") == 1
    with pytest.raises(KeyError, match="'nobody' is not in KG 'star'"):
        kg.entity_index("nobody")
    with pytest.raises(KeyError, match="relation 'r9' is not in KG 'star'"):
        kg.relation_index("r9")
    with pytest.raises(KeyError, match="out of range"):
        kg.neighbors(99)


def test_contains_and_index_of():
    kg = star()
    assert kg.contains("h", "r1", "a") and kg.contains(3, 0, 0)
    assert not kg.contains("a", "r1", "h")  # direction matters
    assert not kg.contains("h", "r2", "a")
    assert not kg.contains("nobody", "r1", "a") and not kg.contains("h", "r9", "a")
    assert kg.index_of([("x", "r1", "y"), ("y", "r1", "x"), ("h", "r1", "b")]).tolist() == [4, -1, 1]
    assert kg.index_of(np.array([[2, 1, 3]])).tolist() == [2]


def test_neighbors_and_degrees():
    kg = star()
    e = lambda ids: kg.entity_names(ids).tolist()
    r, n = kg.neighbors("h", "out")
    assert (r.tolist(), e(n)) == ([0, 0], ["a", "b"])
    r, n = kg.neighbors("h", "in")
    assert (r.tolist(), e(n)) == ([1], ["c"])
    r, n = kg.neighbors("h", "both")
    assert (r.tolist(), e(n)) == ([0, 0, 1], ["a", "b", "c"])
    assert kg.neighbors("b", "both", as_triples=True).tolist() == [1, 5]  # self loop once
    assert kg.neighbors("a", "both", as_triples=True).tolist() == [0, 3]
    assert kg.neighbors("y", "out", as_triples=True).tolist() == []
    assert kg.out_degree.tolist() == [1, 1, 1, 2, 1, 0, 1]
    assert kg.in_degree.tolist() == [1, 2, 0, 1, 1, 1, 1]
    assert kg.incident(["a", "x"], "out").tolist() == [3, 4]
    with pytest.raises(ValueError, match="direction"):
        kg.neighbors("h", "sideways")


def test_triples_of_relation():
    kg = star()
    assert kg.triples_of_relation("r1").tolist() == [0, 1, 4, 5, 6]
    assert kg.triples_of_relation(1).tolist() == [2, 3]


def test_khop_exact():
    kg = star()
    assert kg.khop_triples("h", hops=0).tolist() == []
    assert kg.khop_triples("h", hops=1).tolist() == [0, 1, 2]
    idx, hop = kg.khop_triples("h", hops=2, return_hops=True)
    assert (idx.tolist(), hop.tolist()) == ([0, 1, 2, 3, 5], [1, 1, 1, 2, 2])
    assert kg.khop_triples("h", hops=3).tolist() == [0, 1, 2, 3, 4, 5]
    assert kg.khop_triples(["y", "z"], hops=1).tolist() == [4, 6]
    sub = kg.khop_subgraph("h", hops=2)
    assert sub.num_entities == kg.num_entities and sub.entities is kg.entities  # shared vocabulary
    assert sub.to_dataframe().values.tolist() == [["h", "r1", "a"], ["h", "r1", "b"], ["c", "r2", "h"],
                                                  ["a", "r2", "x"], ["b", "r1", "b"]]


def test_khop_cap_keeps_near_hops_first():
    kg = star()
    for s in range(10):
        capped = kg.khop_triples("h", hops=2, max_triples=4, seed=s)
        assert len(capped) == 4 and {0, 1, 2} <= set(capped.tolist()) and set(capped.tolist()) <= {0, 1, 2, 3, 5}
    assert set(kg.khop_triples("h", hops=2, max_triples=2).tolist()) <= {0, 1, 2}
    draws = {tuple(kg.khop_triples("h", hops=2, max_triples=4, seed=s)) for s in range(20)}
    assert draws == {(0, 1, 2, 3), (0, 1, 2, 5)}  # the seed chooses among the 2-hop triples
    assert (kg.khop_triples("h", 2, max_triples=4, seed=3) == kg.khop_triples("h", 2, max_triples=4, seed=3)).all()


def test_shortest_path_exact():
    kg = star()
    assert kg.shortest_path("c", "y") == [("c", "r2", "h"), ("h", "r1", "a"), ("a", "r2", "x"), ("x", "r1", "y")]
    assert kg.shortest_path("y", "h") == [("x", "r1", "y"), ("a", "r2", "x"), ("h", "r1", "a")]
    assert kg.shortest_path("y", "h", directed=True) is None
    assert kg.shortest_path("h", "y", directed=True) == [("h", "r1", "a"), ("a", "r2", "x"), ("x", "r1", "y")]
    assert kg.shortest_path("c", "y", max_hops=3) is None
    assert kg.shortest_path("h", "z") is None
    assert kg.shortest_path("h", "h") == []
    assert kg.shortest_path("c", "b", as_indices=True).tolist() == [2, 1]
    assert kg.distances("h").tolist() == [1, 1, 1, 0, 2, 3, -1]
    assert kg.distances("h", direction="out").tolist() == [1, 1, -1, 0, 2, 3, -1]


def test_shortest_path_tie_breaks_on_lowest_triple_index():
    kg = KG.from_triples([("s", "r", "a"), ("s", "r", "b"), ("b", "r", "t"), ("a", "r", "t")])
    assert kg.shortest_path("s", "t") == [("s", "r", "b"), ("b", "r", "t")]  # t first reached by triple 2


def test_paths_between_exact():
    kg = KG.from_triples([("s", "r", "a"), ("s", "q", "a"), ("a", "r", "t"), ("s", "r", "t"), ("t", "r", "b"),
                          ("b", "r", "s")])
    idx = lambda ps: [p.tolist() for p in ps]
    assert idx(kg.paths_between("s", "t", max_hops=1, as_indices=True)) == [[3]]
    assert idx(kg.paths_between("s", "t", max_hops=2, as_indices=True)) == [[3], [0, 2], [1, 2], [5, 4]]
    assert idx(kg.paths_between("s", "t", max_hops=2, directed=True, as_indices=True)) == [[3], [0, 2], [1, 2]]
    assert idx(kg.paths_between("s", "t", max_hops=2, limit=2, as_indices=True)) == [[3], [0, 2]]
    assert kg.paths_between("s", "t", max_hops=1) == [[("s", "r", "t")]]
    assert kg.paths_between("t", "s", max_hops=1, directed=True) == []
    with pytest.raises(ValueError, match="max_partial"):
        kg.paths_between("s", "t", max_hops=3, max_partial=1)


def test_remove_subsample_mask_exact():
    kg = star()
    assert kg.remove_triples([0, 6]).triples.tolist() == kg.triples[[1, 2, 3, 4, 5]].tolist()
    assert kg.remove_triples(np.array([True] + [False] * 6)).num_triples == 6
    assert kg.remove_triples([]).num_triples == 7
    assert kg.subgraph([4, 0, 4], name="s").to_dataframe().values.tolist() == [["h", "r1", "a"], ["x", "r1", "y"]]
    assert kg.encode([("c", "r2", "h")]).tolist() == [[2, 1, 3]]
    with pytest.raises(ValueError, match=r"needs \(7,\)"):
        kg.remove_triples(np.ones(3, bool))
    with pytest.raises(IndexError):
        kg.remove_triples([7])
    assert [kg.subsample_edges(k).num_triples for k in (0, 0.1, 0.3, 0.5, 0.99, 1)] == [0, 1, 2, 4, 7, 7]
    with pytest.raises(ValueError, match="fraction"):
        kg.subsample_edges(1.5)
    m = kg.mask_entities(["h", "y"])
    assert m.to_dataframe().values.tolist() == [["a", "r2", "x"], ["b", "r1", "b"], ["z", "r1", "z"]]
    assert m.num_entities == 7 and kg.mask_entities([]).num_triples == 7
    with pytest.raises(KeyError, match="'q'"):
        kg.mask_entities(["q"])


def test_labelling_modes():
    kg = KG.from_triples([("/m/02mjmr", "/people/person/spouse", "/m/025s5v9"), ("/m/025s5v9", "/x/y", "/m/0")],
                         entity_labels={"/m/02mjmr": "Barack Obama", "/m/025s5v9": "Michelle Obama"},
                         relation_labels={"/people/person/spouse": "spouse"})
    assert kg.entity_display("kg_id") == {e: e for e in kg.entities}
    assert kg.entity_display() == kg.entity_display("text")  # the default is no paper's private-id mode
    assert kg.entity_display("text") == {"/m/0": "/m/0", "/m/025s5v9": "Michelle Obama", "/m/02mjmr": "Barack Obama"}
    priv = kg.entity_display("private_id", seed=7)
    assert sorted(priv.values(), key=int) == ["0", "1", "2"]
    assert priv == kg.entity_display("private_id", seed=7)  # deterministic
    assert kg.verbalize([0], "text") == ["Barack Obama, spouse, Michelle Obama"]
    assert kg.verbalize([1], "text") == ["Michelle Obama, /x/y, /m/0"]
    assert kg.verbalize([0], "kg_id", sep=" | ") == ["/m/02mjmr | spouse | /m/025s5v9"]
    p = kg.entity_display("private_id", seed=3)
    assert kg.verbalize([0], "private_id", seed=3) == [f"{p['/m/02mjmr']}, spouse, {p['/m/025s5v9']}"]
    assert len(kg.verbalize()) == 2
    assert kg.to_dataframe(labels=True).values.tolist()[0] == ["Barack Obama", "spouse", "Michelle Obama"]
    with pytest.raises(ValueError, match="private_id"):
        kg.entity_display("names")


def test_parquet_roundtrip_and_errors(tmp_path):
    kg = star().mask_entities("z")
    back = KG.from_parquet(kg.to_parquet(tmp_path / "g"))
    assert back.equals(kg) and back.name == "star-masked"
    with pytest.raises(FileNotFoundError, match="missing"):
        KG.from_parquet(tmp_path / "none")


# ---------------------------------------------------------------- hypothesis properties
ENTS, RELS = [f"e{i}" for i in range(9)], ["r0", "r1", "r2"]
triple = st.tuples(st.sampled_from(ENTS), st.sampled_from(RELS), st.sampled_from(ENTS))
kgs = st.lists(triple, min_size=1, max_size=40).map(lambda ts: KG.from_triples(ts, name="h", entities=ENTS,
                                                                               relations=RELS))
ent = st.sampled_from(ENTS)
SET = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_set(kg):
    return set(map(tuple, kg.to_dataframe().values.tolist()))


def bfs_dist(kg, sources, directed=False):
    "Reference hop distances with a plain Python BFS over string triples."
    adj = {e: set() for e in kg.entities}
    for h, _, t in as_set(kg):
        adj[h].add(t)
        if not directed: adj[t].add(h)
    dist, q = {s: 0 for s in sources}, deque(sources)
    while q:
        u = q.popleft()
        for v in adj[u]:
            if v not in dist: dist[v] = dist[u] + 1; q.append(v)
    return dist


@settings(**SET)
@given(kgs, st.floats(0, 1), st.integers(0, 10**6))
def test_subsample_exact_count_and_subset(kg, keep, seed):
    sub = kg.subsample_edges(keep, seed)
    assert sub.num_triples == round(keep * kg.num_triples)
    assert as_set(sub) <= as_set(kg) and len(as_set(sub)) == sub.num_triples
    assert np.array_equal(sub.triples, kg.subsample_edges(keep, seed).triples)  # seeded


@settings(**SET)
@given(kgs, st.data())
def test_remove_then_not_contained(kg, data):
    idx = data.draw(st.lists(st.integers(0, kg.num_triples - 1), max_size=kg.num_triples))
    out = kg.remove_triples(idx)
    removed = {tuple(x) for x in kg.to_dataframe().values[sorted(set(idx))].tolist()}
    assert all(not out.contains(*t) for t in removed)
    assert as_set(out) == as_set(kg) - removed


@settings(**SET)
@given(kgs, st.lists(ent, min_size=1, max_size=3), st.integers(1, 30), st.integers(0, 99))
def test_khop_monotone_capped_and_matches_definition(kg, seeds, cap, seed):
    prev, prev_capped = set(), set()
    dist = bfs_dist(kg, seeds)
    for k in range(0, 5):
        full = set(kg.khop_triples(seeds, hops=k, max_triples=None).tolist())
        ref = {i for i, (h, _, t) in enumerate(kg.to_dataframe().values.tolist())
               if min(dist.get(h, 99), dist.get(t, 99)) <= k - 1}
        assert full == ref and prev <= full
        capped = set(kg.khop_triples(seeds, hops=k, max_triples=cap, seed=seed).tolist())
        assert len(capped) <= cap and capped <= full and prev_capped <= capped
        assert len(capped) == min(cap, len(full))
        prev, prev_capped = full, capped


@settings(**SET)
@given(kgs, ent, ent, st.booleans())
def test_shortest_path_matches_bfs(kg, src, dst, directed):
    path = kg.shortest_path(src, dst, max_hops=8, directed=directed)
    d = bfs_dist(kg, [src], directed).get(dst)
    if d is None:
        assert path is None
        return
    assert len(path) == d and all(kg.contains(*t) for t in path)
    node = src
    for h, _, t in path:  # a connected walk from src to dst
        assert node in ((h,) if directed else (h, t))
        node = t if h == node else h
    assert node == dst


@settings(**SET)
@given(kgs, ent, ent, st.integers(1, 3), st.booleans())
def test_paths_between_matches_brute_force(kg, src, dst, max_hops, directed):
    rows = kg.triples.tolist()
    s, d = kg.entity_index(src), kg.entity_index(dst)
    ref = []
    def dfs(node, visited, path):
        if node == d and path: ref.append(tuple(path)); return
        if len(path) == max_hops: return
        for i, (h, _, t) in enumerate(rows):
            for a, b in ((h, t),) if directed else ((h, t), (t, h)):
                if a == node and b not in visited: dfs(b, visited | {b}, path + [i])
    if s != d: dfs(s, {s}, [])
    got = [tuple(p.tolist()) for p in kg.paths_between(src, dst, max_hops, directed, limit=None, as_indices=True)]
    assert sorted(got) == sorted(set(ref)) and len(got) == len(set(got))
    assert [len(p) for p in got] == sorted(len(p) for p in got)


@settings(**SET)
@given(kgs, st.lists(ent, max_size=4))
def test_mask_removes_exactly_touching_triples(kg, masked):
    out = kg.mask_entities(masked)
    assert as_set(out) == {t for t in as_set(kg) if t[0] not in masked and t[2] not in masked}
    assert out.entities is kg.entities


@settings(**SET)
@given(kgs, st.dictionaries(ent, st.text(max_size=5)), st.text(min_size=1, max_size=8))
def test_parquet_roundtrip(kg, labels, name):
    kg = KG.from_arrays(kg.triples, kg.entities, kg.relations, entity_labels=labels,
                        relation_labels={"r1": "rel one"}, name=name)
    with tempfile.TemporaryDirectory() as d:
        back = KG.from_parquet(kg.to_parquet(Path(d) / "kg"))
    assert back.equals(kg) and back.triples.dtype == np.int32


@settings(**SET)
@given(kgs, st.integers(0, 2**32 - 1))
def test_private_ids_are_a_bijection(kg, seed):
    disp = kg.entity_display("private_id", seed)
    assert sorted(map(int, disp.values())) == list(range(kg.num_entities))
    assert set(disp) == set(kg.entities.tolist())


@settings(**SET)
@given(kgs, st.lists(triple, max_size=10))
def test_contains_matches_set(kg, queries):
    truth = as_set(kg)
    assert [kg.contains(*q) for q in queries] == [q in truth for q in queries]


# ---------------------------------------------------------------- real data: FB15k-237
@pytest.fixture(scope="module")
def fb15k237():
    path = get_config().data_dir / "fb15k237" / "train.txt"
    if not path.exists(): pytest.skip(f"{path} missing: the offline data mirror is not available")
    df = pd.read_csv(path, sep="\t", header=None, names=list(COLUMNS), dtype=str, keep_default_na=False, quoting=3)
    return KG.from_triples(df, name="fb15k237-train")


def test_fb15k237_two_hop_subgraphs(fb15k237):
    kg = fb15k237
    assert (kg.num_triples, kg.num_entities, kg.num_relations) == (272_115, 14_505, 237)
    n, h, t = kg.num_entities, kg.triples[:, 0], kg.triples[:, 2]
    adj = sp.coo_matrix((np.ones(len(h)), (h, t)), shape=(n, n)).tocsr()
    rng = np.random.default_rng(0)
    seeds = list(rng.choice(n, 20, replace=False)) + [int(np.argmax(kg.out_degree + kg.in_degree))]
    dist = cs_shortest_path(adj, directed=False, unweighted=True, indices=seeds)  # independent reference
    capped = 0
    for s, d in zip(seeds, dist):
        idx = kg.khop_triples(s, hops=2, max_triples=AWAKENING_MAX_SUBGRAPH_TRIPLES)
        assert len(idx) <= AWAKENING_MAX_SUBGRAPH_TRIPLES
        near = np.minimum(d[h], d[t])
        assert (near[idx] <= 1).all()  # every triple within 2 hops
        hop1 = np.flatnonzero(near == 0)
        assert np.isin(hop1, idx).all()  # nearer hop kept whole
        within = np.flatnonzero(near <= 1)
        if len(within) <= AWAKENING_MAX_SUBGRAPH_TRIPLES:
            assert np.array_equal(idx, within)
        else:
            capped += 1
            assert len(idx) == AWAKENING_MAX_SUBGRAPH_TRIPLES
    assert capped >= 1  # the hub's 2-hop neighbourhood passes the cap
    assert len(kg.khop_triples(seeds[-1], hops=2)) > AWAKENING_MAX_SUBGRAPH_TRIPLES  # no cap by default (base layer)
