"""Tests of kgrag_nb.backends.

`SparqlBackend` runs against a real SPARQL engine: `pyoxigraph` loaded with `kg_to_rdf` of FB15k-237 / CoDEx-S subgraphs,
served over HTTP on 127.0.0.1 by `OxigraphEndpoint`; every answer is compared with `LocalBackend` on the same graph.
Relation retrieval uses the real offline MiniLM and real FAISS.
"""
import email.utils, time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck, strategies as st

from kgrag_nb.kg import KG
from kgrag_nb.datasets import load_kg
from kgrag_nb.backends import (SparqlDialect, kg_to_rdf, kg_to_store, LocalBackend, SparqlBackend, OxigraphEndpoint,
                               SparqlCache, SparqlError, SparqlQueryError, SparqlUnavailableError, DIRECTIONS, FB, WD,
                               WDT, RDFS_LABEL, CountingEncoder, RelationRetriever, RELATION_MODES, cwq_relation_queries,
                               bench_relation_retrieval)
from kgrag_nb.llm import retry_after_seconds as _retry_after
# the awakening paper's App. C settings, which the study passes to this general layer (issue 24: no paper defaults here)
from kgrag_nb.studies.awakening.task1 import AWAKENING_IVF, AWAKENING_MAX_SUBGRAPH_TRIPLES

SEED = "/m/02d02"  # Detroit Tigers, a CWQ topic entity; its 2-hop subgraph in FB15k-237 has 2,447 triples


@pytest.fixture(scope="module")
def fb15k():
    return load_kg("fb15k237")


@pytest.fixture(scope="module")
def small(fb15k):
    return fb15k.khop_subgraph(SEED, hops=2, max_triples=None)


@pytest.fixture(scope="module")
def local(small):
    return LocalBackend(small)


@pytest.fixture(scope="module")
def store(small, local):
    ents = small.entities[np.unique(small.triples[:, [0, 2]])].tolist()
    return kg_to_store(small, "freebase", types={e: local.entity_types(e) for e in ents})


@pytest.fixture(scope="module")
def endpoint(store):
    with OxigraphEndpoint(store) as ep:
        yield ep


@pytest.fixture(scope="module")
def sparql(endpoint, tmp_path_factory):
    with SparqlBackend(endpoint.url, "freebase", cache_dir=tmp_path_factory.mktemp("sparql"), min_interval_s=0) as b:
        yield b


def present_entities(kg, n, seed=0):
    "n entities that occur in triples of kg (seeded)."
    ents = kg.entities[np.unique(kg.triples[:, [0, 2]])]
    return np.random.default_rng(seed).choice(ents, n, replace=False).tolist()


# ---------------------------------------------------------------- dialects and RDF

def test_small_graph_is_what_we_think(small):
    assert small.num_triples == 2447
    assert small.entity_labels[SEED] == "Detroit Tigers"


@given(st.lists(st.from_regex(r"[a-z0-9_]{1,6}", fullmatch=True), min_size=1, max_size=4),
       st.lists(st.lists(st.from_regex(r"[a-z0-9_]{1,6}", fullmatch=True), min_size=1, max_size=3), max_size=2))
def test_freebase_relation_ids_round_trip(first, cvts):
    rel = "/" + "/".join(first) + "".join("./" + "/".join(c) for c in cvts)
    d = SparqlDialect("freebase")
    iri = d.relation_iri(rel)
    assert iri.startswith(FB) and "/" not in iri[len(FB):]
    assert d.iri_to_relation(iri) == rel


@given(st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s))
def test_generic_ids_round_trip(x):
    d = SparqlDialect("generic")
    assert d.iri_to_entity(d.entity_iri(x)) == x and d.iri_to_relation(d.relation_iri(x)) == x
    assert d.is_entity(d.entity_iri(x)) and not d.is_entity(d.relation_iri(x))


def test_dialect_iris_by_hand():
    fb, wd = SparqlDialect("freebase"), SparqlDialect("wikidata")
    assert fb.entity_iri("/m/02d02") == fb.entity_iri("m.02d02") == "http://rdf.freebase.com/ns/m.02d02"
    assert fb.relation_iri("/film/actor/film./film/performance/film") == FB + "film.actor.film..film.performance.film"
    assert fb.relation_iri("film.film.genre") == FB + "film.film.genre"  # dotted Freebase form accepted
    assert fb.iri_to_entity(FB + "g.11b6") == "/g/11b6"
    assert (wd.entity_iri("Q42"), wd.relation_iri("P31"), wd.relation_label_iri("P31")) == (WD + "Q42", WDT + "P31", WD + "P31")
    assert wd.iri_to_type(WD + "Q5") == "Q5"


@pytest.mark.parametrize("dialect,bad,msg", [("wikidata", "Tom Gores", "find_entities"), ("wikidata", "Q0", "Q42"),
                                             ("freebase", "02d02", "/m/02mjmr"), ("generic", "", "empty")])
def test_malformed_entity_ids_are_named(dialect, bad, msg):
    with pytest.raises(ValueError, match=msg):
        SparqlDialect(dialect).entity_iri(bad)


def test_bad_base_iri_and_dialect():
    with pytest.raises(ValueError, match="ending in"): SparqlDialect("generic", "http://x.org/kg")
    with pytest.raises(ValueError, match="only for the generic"): SparqlDialect("wikidata", "http://x.org/")
    with pytest.raises(ValueError, match="is not one of"): SparqlDialect("yago")


def test_kg_to_rdf_counts_and_escapes():
    kg = KG.from_triples([("a", "r", "b"), ("b", "r", "c")], entity_labels={"a": 'say "hi"\\\n\tnow', "b": "été 東京"},
                         relation_labels={"r": "rel"})
    nt = kg_to_rdf(kg, "generic")
    assert len(nt.splitlines()) == 2 + 2 + 1  # triples, entity labels, relation label (rdfs:label only in generic)
    store = kg_to_store(kg, "generic")
    labels = {str(s["l"].value) for s in store.query(f"SELECT ?l WHERE {{ ?e <{RDFS_LABEL}> ?l }}")}
    assert labels == {'say "hi"\\\n\tnow', "été 東京", "rel"}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.text(min_size=1, max_size=8), st.sampled_from(["r 1", "r/2", "é"]), st.text(min_size=1, max_size=8)),
                min_size=1, max_size=25),
       st.text(min_size=1, max_size=15))
def test_generic_kg_over_http_equals_local(triples, label):
    "Any string ids and labels: the SPARQL backend over HTTP answers exactly as the local one."
    triples = [(h.replace("\x00", "_"), r, t.replace("\x00", "_")) for h, r, t in triples]
    label = label.replace("\x00", "_")
    kg = KG.from_triples(triples, entity_labels={triples[0][0]: label})
    loc = LocalBackend(kg)
    with OxigraphEndpoint(kg_to_store(kg, "generic")) as ep, \
         SparqlBackend(ep.url, "generic", cache_dir=False, min_interval_s=0, batch_size=3) as sp:
        seed = triples[0][0]
        for hops in (1, 2):
            assert sp.khop_triples(seed, hops, None) == loc.khop_triples(seed, hops, None)
        assert sp.neighbors(triples[-1][2]) == loc.neighbors(triples[-1][2])
        assert sp.labels(kg.entities) == loc.labels(kg.entities)
        assert sp.find_entities(label) == loc.find_entities(label)


# ---------------------------------------------------------------- same answers as LocalBackend

@pytest.mark.parametrize("hops", [0, 1, 2, 3])
def test_khop_same_as_local(sparql, local, small, hops):
    for seeds in [SEED, *present_entities(small, 4), present_entities(small, 3, seed=1)]:
        assert sparql.khop_triples(seeds, hops, None) == local.khop_triples(seeds, hops, None)
    assert len(sparql.khop_triples(SEED, hops, None)) == {0: 0, 1: 48, 2: 2447}.get(hops, len(local.khop_triples(SEED, hops, None)))


def test_khop_batching_changes_queries_not_answers(endpoint, local, small):
    full = local.khop_triples(SEED, 2, None)
    with SparqlBackend(endpoint.url, "freebase", cache_dir=False, min_interval_s=0, batch_size=5) as b:
        assert b.khop_triples(SEED, 1, None) == local.khop_triples(SEED, 1, None)
        assert b.last_khop["queries"] == 2  # one batch (the seed), out-edges and in-edges
        assert b.khop_triples(SEED, 2, None) == full
        n_hop1 = len({x for h, _, t in local.khop_triples(SEED, 1, None) for x in (h, t)} - {SEED})
        assert b.last_khop["queries"] == 2 + 2 * -(-n_hop1 // 5)  # hop 2: ceil(frontier / batch_size) batches x 2


def test_neighbors_same_as_local(sparql, local, small):
    hub = small.entities[np.argmax(small.out_degree + small.in_degree)]
    for e in [SEED, hub, *present_entities(small, 6)]:
        for d in DIRECTIONS:
            assert sparql.neighbors(e, d) == local.neighbors(e, d)
    assert len(sparql.neighbors(hub, "both", limit=7)) == 7
    assert sparql.neighbors("/m/0notthere") == local.neighbors("/m/0notthere") == []


def test_labels_types_and_relation_labels_same_as_local(sparql, local, small):
    ents = small.entities.tolist()
    assert sparql.labels(ents) == local.labels(ents)
    assert len(local.labels(ents)) > 0.9 * len(ents)
    assert sparql.label(SEED) == "Detroit Tigers" and sparql.label("/m/0notthere") is None
    assert sparql.relation_labels(small.relations) == local.relation_labels(small.relations)
    for e in [SEED, *present_entities(small, 8)]:
        assert sparql.entity_types(e) == local.entity_types(e)
    assert "/sports/sports_team" in local.entity_types(SEED)  # Freebase schema fallback: /sports/sports_team/...


def test_find_entities_same_as_local(sparql, local, small):
    labels = small.entity_labels
    for e in present_entities(small, 15):
        if e in labels:
            assert sparql.find_entities(labels[e]) == local.find_entities(labels[e])
            assert e in local.find_entities(labels[e])
    assert sparql.find_entities(" Detroit Tigers ") == local.find_entities("Detroit Tigers") == [SEED]
    assert sparql.find_entities("detroit tigers") == local.find_entities("detroit tigers") == []


def test_triples_with_relation_same_as_local(sparql, local, small):
    for r in small.relations[np.unique(small.triples[:, 1])][:20].tolist():
        assert sparql.triples_with_relation(r, None) == local.triples_with_relation(r, None)
    r = small.relations[np.bincount(small.triples[:, 1]).argmax()]
    few = sparql.triples_with_relation(r, 3)
    assert len(few) == 3 and set(few) <= set(local.triples_with_relation(r, None))


def test_subgraph_kg_same_triples_and_labels(sparql, small):
    sub = sparql.subgraph_kg(SEED, hops=2)
    assert set(sub.to_dataframe().itertuples(index=False, name=None)) == set(small.to_dataframe().itertuples(index=False, name=None))
    assert all(sub.entity_labels[e] == small.entity_labels[e] for e in sub.entity_labels)
    assert sub.relation_labels == {r: small.relation_labels[r] for r in sub.relations if r in small.relation_labels}


def test_wikidata_dialect_on_codex(tmp_path):
    "CoDEx-S (Wikidata QIDs/PIDs) rendered as Wikidata RDF: wd:/wdt: IRIs, relation labels on wd:P…, P31 types."
    codex = load_kg("codex-s")
    seed = codex.entities[np.argmax(codex.out_degree)]
    sub = codex.khop_subgraph(seed, hops=1, max_triples=None)
    extra = KG.from_triples([("Q1", "P31", "Q5"), ("Q1", "P27", "Q30")], entity_labels={"Q1": "Someone"})
    loc = LocalBackend(sub)
    with OxigraphEndpoint(kg_to_store(extra, "wikidata", store=kg_to_store(sub, "wikidata"))) as ep, \
         SparqlBackend(ep.url, "wikidata", cache_dir=tmp_path, min_interval_s=0) as sp:
        assert sp.khop_triples(seed, 1, None) == loc.khop_triples(seed, 1, None)
        assert sp.relation_labels(sub.relations) == loc.relation_labels(sub.relations)
        assert set(sp.relation_labels(sub.relations).values()) <= set(codex.relation_labels.values())
        assert sp.entity_types("Q1") == LocalBackend(extra).entity_types("Q1") == ["Q5"]
        assert sp.find_entities("Someone") == ["Q1"]
        with pytest.raises(ValueError, match="find_entities"): sp.neighbors("Someone")
        assert [r["status"] for r in ep.requests] == [200] * len(ep.requests)


# ---------------------------------------------------------------- the 40,000-triple cap (LIMIT per query)

def check_cap(sparql, local, m):
    hop1 = set(local.khop_triples(SEED, 1, None))
    full = set(local.khop_triples(SEED, 2, None))
    got = sparql.khop_triples(SEED, 2, m)
    assert len(got) == len(set(got)) == min(m, len(full))
    assert set(got) <= full
    if m >= len(hop1): assert hop1 <= set(got)  # nearer hops complete
    else: assert set(got) <= hop1


@pytest.mark.parametrize("m", [0, 1, 47, 48, 49, 500, 2446, 2447, 5000])
def test_cap_exact(endpoint, local, m):
    assert len(local.khop_triples(SEED, 1, None)) == 48
    with SparqlBackend(endpoint.url, "freebase", cache_dir=False, min_interval_s=0, batch_size=50) as b:
        check_cap(b, local, m)
        assert b.last_khop["capped"] == (m <= 2447)  # the budget ran out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2600), st.sampled_from([7, 64, 1000]))
def test_cap_property(endpoint, local, m, batch):
    with SparqlBackend(endpoint.url, "freebase", cache_dir=False, min_interval_s=0, batch_size=batch) as b:
        check_cap(b, local, m)


def test_cap_is_a_limit_on_the_queries(endpoint, local):
    with SparqlBackend(endpoint.url, "freebase", cache_dir=False, min_interval_s=0) as b:
        n0 = len(endpoint.requests)
        b.khop_triples(SEED, 2, 100)
        sent = [r["query"] for r in endpoint.requests[n0:]]
    assert sent and all(" LIMIT " in q for q in sent)
    assert sent[0].endswith("LIMIT 100")  # first query: the whole budget, nothing taken yet


# ---------------------------------------------------------------- cache, retries, rate limit, errors

def test_cache_hit_sends_no_request(store, tmp_path):
    with OxigraphEndpoint(store) as ep, OxigraphEndpoint(store) as other:
        with SparqlBackend(ep.url, "freebase", cache_dir=tmp_path, min_interval_s=0) as a:
            first = a.khop_triples(SEED, 2, None)
            n = len(ep.requests)
            assert n == a.stats["requests"] > 0 and a.stats["cache_hits"] == 0
            assert a.khop_triples(SEED, 2, None) == first
            assert len(ep.requests) == n and a.stats["cache_hits"] == n
        assert len(SparqlCache(tmp_path / "results.sqlite")) == n
        # the key is the query text, not the endpoint: a backend on another endpoint with this cache sends nothing
        with SparqlBackend(other.url, "freebase", cache_dir=tmp_path, min_interval_s=0) as b:
            assert b.khop_triples(SEED, 2, None) == first
        assert other.requests == []


def test_no_cache_when_disabled(store):
    with OxigraphEndpoint(store) as ep, SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0) as b:
        b.label(SEED); b.label(SEED)
        assert len(ep.requests) == 2 and b.cache is None


def test_503_twice_then_success_is_retried(store):
    with OxigraphEndpoint(store, fail_first=2, fail_status=503) as ep, \
         SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0, backoff_s=0.01) as b:
        assert b.label(SEED) == "Detroit Tigers"
        assert [r["status"] for r in ep.requests] == [503, 503, 200]
        assert b.stats == dict(requests=3, cache_hits=0, retries=2)


def test_backoff_doubles(store):
    with OxigraphEndpoint(store, fail_first=2, fail_status=502) as ep, \
         SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0, backoff_s=0.2) as b:
        b.label(SEED)
        gaps = np.diff([r["t"] for r in ep.requests])
    assert gaps[0] >= 0.2 - 0.01 and gaps[1] >= 0.4 - 0.01 and gaps[1] < 1.5


def test_retry_after_is_honoured(store):
    with OxigraphEndpoint(store, fail_first=1, fail_status=429, retry_after=1) as ep, \
         SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0, backoff_s=0) as b:
        assert b.label(SEED) == "Detroit Tigers"
        gap = ep.requests[1]["t"] - ep.requests[0]["t"]
    assert 1.0 - 0.01 <= gap < 3


def test_retry_after_parsing():
    assert _retry_after("7") == 7.0 and _retry_after(None) is None and _retry_after("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 27 <= _retry_after(later) <= 30
    assert _retry_after(email.utils.formatdate(time.time() - 30, usegmt=True)) == 0.0


def test_the_sparql_backend_and_the_llm_client_share_one_retry_policy():
    "One HTTP retry policy (llm.retry_policy): the backend builds no tenacity loop and parses no Retry-After itself."
    import kgrag_nb.backends as B, kgrag_nb.llm as L
    backends, llm = Path(B.__file__).read_text(), Path(L.__file__).read_text()
    assert "Retrying" not in backends and "parsedate_to_datetime" not in backends and "retry_policy(" in backends
    assert "def retry_policy(" in llm and llm.count("parsedate_to_datetime") == 1 and "return retry_policy(" in llm


def test_exhausted_retries_raise_unavailable(store):
    with OxigraphEndpoint(store, fail_first=100, fail_status=429) as ep, \
         SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0, max_retries=2, backoff_s=0) as b:
        with pytest.raises(SparqlUnavailableError, match=r"HTTP 429 .* all 3 attempts .*SELECT \?x \?l") as e:
            b.label(SEED)
        assert len(ep.requests) == 3 and isinstance(e.value, ConnectionError)


def test_400_is_a_clear_error_not_retried(store):
    with OxigraphEndpoint(store) as ep, SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0) as b:
        with pytest.raises(SparqlQueryError) as e:
            b.select("SELEC ?x WHERE { ?x ?p ?o } LIMIT 3")
        msg = str(e.value)
        assert "HTTP 400" in msg and "'SELEC ?x WHERE { ?x ?p ?o } LIMIT 3'" in msg and "Parse error" in msg
        assert isinstance(e.value, ValueError) and len(ep.requests) == 1 and b.stats["retries"] == 0


def test_wrong_path_and_non_json_answers(store):
    with OxigraphEndpoint(store) as ep:
        with SparqlBackend(ep.url.replace("/sparql", "/query"), "freebase", cache_dir=False, min_interval_s=0) as b:
            with pytest.raises(SparqlQueryError, match="HTTP 404"): b.label(SEED)
        with SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0) as b:
            with pytest.raises(SparqlError, match="not SPARQL JSON"):
                b.query_json("CONSTRUCT { ?s ?p ?o } WHERE { ?s ?p ?o } LIMIT 1")


def test_connection_refused_is_unavailable(store):
    ep = OxigraphEndpoint(store).start(); url = ep.url; ep.stop()
    with SparqlBackend(url, "freebase", cache_dir=False, min_interval_s=0, max_retries=1, backoff_s=0) as b:
        with pytest.raises(SparqlUnavailableError, match="ConnectError"):
            b.label(SEED)


def test_min_interval_is_respected(store, small):
    with OxigraphEndpoint(store) as ep, SparqlBackend(ep.url, "freebase", cache_dir=False, min_interval_s=0.15) as b:
        t0 = time.monotonic()
        for e in present_entities(small, 5): b.label(e)
        took = time.monotonic() - t0
        seen = np.array([r["t"] for r in ep.requests]) - t0  # the server's clock is this process's `time.monotonic`
    # the client sends request i no earlier than i intervals after the first; the server sees a request at its send time or
    # later (scheduling delays only add: on a loaded 2-core machine the first request was once seen 130 ms late, which
    # made the first server-side gap 20 ms), so each one's lower bound holds whatever the load. 10 ms of slack for the
    # clock reads; without the interval all five are seen within ~20 ms of t0.
    assert len(seen) == 5 and (seen[1:] >= 0.15 * np.arange(1, 5) - 0.01).all(), seen
    assert took >= 4 * 0.15


def test_get_for_short_and_post_for_long_queries(endpoint, small, local):
    ents = small.entities.tolist()
    with SparqlBackend(endpoint.url, "freebase", cache_dir=False, min_interval_s=0, batch_size=1000) as b:
        n0 = len(endpoint.requests)
        b.label(SEED); b.labels(ents)
        assert [r["method"] for r in endpoint.requests[n0:]] == ["GET"] + ["POST"] * -(-len(ents) // 1000)
    with SparqlBackend(endpoint.url, "freebase", cache_dir=False, min_interval_s=0, method="post") as b:
        assert b.labels(ents[:50]) == local.labels(ents[:50])
        assert endpoint.requests[-1]["method"] == "POST"


def test_bad_arguments_are_named(endpoint):
    with pytest.raises(ValueError, match="http"): SparqlBackend("query.wikidata.org/sparql")
    with pytest.raises(ValueError, match="method"): SparqlBackend(endpoint.url, method="put")
    with SparqlBackend(endpoint.url, "freebase", cache_dir=False, min_interval_s=0) as b:
        n0 = len(endpoint.requests)
        with pytest.raises(ValueError, match="direction"): b.neighbors(SEED, "sideways")
        with pytest.raises(ValueError, match="hops"): b.khop_triples(SEED, -1)
        with pytest.raises(ValueError, match="02mjmr"): b.khop_triples(["Detroit Tigers"])
        assert len(endpoint.requests) == n0  # nothing was sent


# ---------------------------------------------------------------- relation retrieval

@pytest.fixture(scope="module")
def model():
    from kgrag_nb.retrieval import load_embedder
    return load_embedder()


@pytest.fixture(scope="module")
def rel_kg(small):
    return small.subsample_edges(0.25, seed=1)  # 612 triples


@pytest.fixture(scope="module")
def retrievers(rel_kg, model):
    out = {}
    for mode in RELATION_MODES:
        enc = CountingEncoder(model)
        out[mode] = (RelationRetriever(rel_kg, mode, enc, cache_dir=False, **AWAKENING_IVF), enc)
    return out


def test_encoder_calls_by_hand(rel_kg, retrievers):
    n_texts = len(np.unique(rel_kg._relation_text()[rel_kg.triples[:, 1]]))
    assert rel_kg.num_triples == 612
    assert retrievers["faithful"][1].texts == 612 and retrievers["faithful"][0].index_vectors == 612
    assert retrievers["distinct"][1].texts == n_texts and retrievers["distinct"][0].index_vectors == n_texts


@pytest.mark.parametrize("k", [1, 3, 10])
def test_same_candidates(retrievers, k):
    queries = cwq_relation_queries()[:12]
    (f, _), (d, _) = retrievers["faithful"], retrievers["distinct"]
    for q in queries:
        a, b = f.retrieve(q, k), d.retrieve(q, k)
        assert np.array_equal(a, b), q
        assert len(np.unique(d._tid[b])) == k  # exactly k relation texts ...
        assert np.isin(np.flatnonzero(np.isin(d._tid, d._tid[b])), b).all()  # ... with all their triples
        assert [t for t, _ in f.nearest_relations(q, k)] == [t for t, _ in d.nearest_relations(q, k)]


def test_exact_label_query_returns_that_relation(rel_kg, retrievers):
    r = rel_kg.relations[np.bincount(rel_kg.triples[:, 1]).argmax()]
    text = rel_kg.relation_labels[r]
    for mode in RELATION_MODES:
        rr = retrievers[mode][0]
        (best, score), = rr.nearest_relations(text, 1)
        assert best == text and score == pytest.approx(1.0, abs=1e-4)
        assert np.array_equal(rr.retrieve(text, 1), rel_kg.triples_of_relation(r))
        assert set(rr.retrieve(text, 1, as_strings=True)) == set(rel_kg._names(rel_kg.triples_of_relation(r)))


def test_relations_sharing_a_label_share_a_vector(model):
    kg = KG.from_triples([("a", "r1", "b"), ("b", "r2", "c"), ("c", "r3", "a"), ("a", "r3", "c")],
                         relation_labels={"r1": "same words", "r2": "same words", "r3": "completely different thing"})
    for mode in RELATION_MODES:
        enc = CountingEncoder(model)
        rr = RelationRetriever(kg, mode, enc, cache_dir=False)
        assert enc.texts == (4 if mode == "faithful" else 2)
        assert rr.retrieve("same words", 1).tolist() == [0, 1]
        assert rr.retrieve("same words", 2).tolist() == [0, 1, 2, 3]


def test_fixed_nprobe_search_and_errors(retrievers):
    f, d = retrievers["faithful"][0], retrievers["distinct"][0]
    ids, scores = f.top_triples("sports sports team colors", 5, nprobe=f.nlist_used)
    assert len(ids) == 5 and (np.diff(scores) <= 1e-6).all()
    with pytest.raises(ValueError, match="faithful"): d.top_triples("x")
    with pytest.raises(ValueError, match="k=0"): d.retrieve("x", 0)
    with pytest.raises(ValueError, match="relation_text"): d.retrieve("  ", 1)
    with pytest.raises(ValueError, match="mode"): RelationRetriever(KG.from_triples([("a", "r", "b")]), "approx")


def test_benchmark_small(model):
    res = bench_relation_retrieval(n=300, k=3, n_queries=6, max_triples=AWAKENING_MAX_SUBGRAPH_TRIPLES, ivf=AWAKENING_IVF)
    assert res["triples"] == 300 and res["queries"] == 6
    assert res["encoder_calls_faithful"] == 300 + 6
    assert res["encoder_calls_distinct"] == res["relations"] + 6 and res["index_vectors_distinct"] == res["relations"]
    assert res["same_candidates"] is True and res["same_candidates_queries"] == 6
    assert {"seconds_faithful", "seconds_distinct"} <= set(res)


def test_certified_search_beats_fixed_nprobe(rel_kg, retrievers, model):
    "Many lists, nprobe=1: the plain IVF search misses relations; the certified faithful search still matches distinct."
    f = RelationRetriever(rel_kg, "faithful", model, cache_dir=False, nlist=AWAKENING_IVF["nlist"], train_factor=4, nprobe=1)
    d = retrievers["distinct"][0]
    assert f.nlist_used == 612 // 4 and f.nprobe == 1
    misses = 0
    for q in cwq_relation_queries()[:12]:
        exact = d.retrieve(q, 3)
        assert np.array_equal(f.retrieve(q, 3), exact), q
        ids, _ = f.top_triples(q, len(exact), nprobe=1)
        misses += not np.array_equal(np.sort(ids), exact)
    assert misses > 0


def test_no_paper_defaults_in_backends(local):
    "The k-hop methods cap nothing unless asked (a study passes its cap), and the IVF settings are DenseIndex's generic ones."
    import inspect
    for f in (LocalBackend.khop_triples, LocalBackend.subgraph_kg, SparqlBackend.khop_triples):
        assert inspect.signature(f).parameters["max_triples"].default is None, f
    p = inspect.signature(RelationRetriever).parameters
    assert (p["nlist"].default, p["train_factor"].default, p["sample_per_batch"].default) == (None, 40, 20_000)
    assert len(local.khop_triples(SEED, 2)) == len(local.khop_triples(SEED, 2, None)) == 2447
