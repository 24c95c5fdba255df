"""Tests of kgrag_nb.datasets: mirror checksums, fetch errors, safe extraction, loaders and a loopback download."""
import hashlib, io, json, os, shutil, socket, stat, subprocess, sys, tarfile, time, urllib.request, warnings, zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from kgrag_nb.config import get_config
from kgrag_nb import datasets as D
from kgrag_nb.datasets import (REGISTRY, DatasetFile, DatasetSpec, ChecksumError, DatasetUnavailableError, UnsafeArchiveError,
                               DatasetFormatError, fetch, fetch_file, safe_extract, dataset_checksums, load_kg, kg_frame,
                               load_qa, load_corpus, parse_qa_records, read_json_records, read_triples, mid_to_fb15k,
                               fb15k_to_mid, topic_in_kg, to_frame, cached_sha256, file_sha256, list_datasets, QARecord)

MIRROR = get_config().data_dir
pytestmark = pytest.mark.skipif(not (MIRROR / "SOURCES.md").exists(), reason="offline data mirror (KGRAG_DATA) not present")


@pytest.fixture
def tmp_cfg(tmp_path):
    "A config with an empty mirror and its own cache (nothing shared with the project cache)."
    (tmp_path / "mirror").mkdir()
    return get_config(data_dir=tmp_path / "mirror", cache_dir=tmp_path / "cache")


# ------------------------------------------------------------------ registry and checksums
@pytest.mark.parametrize("rel", sorted(D._MIRROR))
def test_every_mirror_file_matches_its_pinned_sha256(rel):
    sha, size, *_ = D._MIRROR[rel]
    path = MIRROR / rel
    assert path.stat().st_size == size
    assert file_sha256(path) == sha  # hashed directly, not through the cache


def test_registry_covers_every_mirror_file_once():
    on_disk = {p.relative_to(MIRROR).as_posix() for p in MIRROR.rglob("*") if p.is_file() and p.name != "SOURCES.md"}
    pinned = [f.path for s in REGISTRY.values() for f in s.files if f.sha256]
    assert set(pinned) == on_disk
    offline = [s for s in REGISTRY.values() if s.offline_available]
    assert all(f.sha256 and f.url.startswith("https://raw.githubusercontent.com/") for s in offline for f in s.files)
    online = [s for s in REGISTRY.values() if not s.offline_available]
    assert {"wikidata5m", "2wikimultihopqa", "mintaka_train", "mintaka_test"} <= {s.name for s in online}
    assert all(f.sha256 is None and f.url.startswith("http") for s in online for f in s.files)
    assert len(list_datasets()) == len(REGISTRY) == 31
    assert REGISTRY["nq_open_oracle"].file("nq-open-oracle.jsonl.gz").url.endswith("/nelson-liu/lost-in-the-middle/29b8a6d0/qa_data/nq-open-oracle.jsonl.gz")
    assert REGISTRY["medical_zh"].offline_available and "GB18030" in REGISTRY["medical_zh"].notes


def test_archive_members_name_the_archive_url():
    f = REGISTRY["fb15k237"].file("fb15k237/train.txt")
    assert f.url == "https://raw.githubusercontent.com/TimDettmers/ConvE/f3c0eb286025410fa5b4c04696c918264163d0ca/FB15k-237.tar.gz"
    assert f.member == "train.txt"
    assert REGISTRY["family"].file("facts.txt").url.endswith("/alisadeghian/DRUM/28587b5dd412c6107a3a8ee174a21c97a6ec8acd/datasets/family/facts.txt")


def test_fetch_returns_verified_mirror_paths_for_every_offline_dataset():
    for s in REGISTRY.values():
        if not s.offline_available: continue
        paths = fetch(s.name)
        assert set(paths) == {f.path for f in s.files}
        assert all(p == MIRROR / rel for rel, p in paths.items())


def test_dataset_checksums_are_the_pinned_hashes():
    sums = dataset_checksums(["family", "nq_open"])
    assert sums["family/facts.txt"] == "137b7c79a58d49d4b0bf81321e3b25c9f570e88ab3ce437969cc8012c64b2f8e"
    assert sums["nq_open/NQ-open.dev.jsonl"] == "f15567f38099f3615f5b8a685c0aef449c11ad90d3da3735e8d1b98115b40616"
    assert len(sums) == 7 and dataset_checksums("nq_open") == {"nq_open/NQ-open.dev.jsonl": sums["nq_open/NQ-open.dev.jsonl"]}


def test_hash_cache_reuses_and_invalidates(tmp_path):
    cfg = get_config(cache_dir=tmp_path / "cache")
    p = tmp_path / "f.bin"; p.write_bytes(b"abc")
    assert cached_sha256(p, cfg) == hashlib.sha256(b"abc").hexdigest()
    cache_file = tmp_path / "cache" / "datasets" / "sha256_cache.json"
    data = json.loads(cache_file.read_text()); data[str(p.resolve())]["sha256"] = "from-cache"; cache_file.write_text(json.dumps(data))
    assert cached_sha256(p, cfg) == "from-cache"
    p.write_bytes(b"abd")  # same size; the new mtime invalidates the entry
    os.utime(p, ns=(10**9, 10**9))
    assert cached_sha256(p, cfg) == hashlib.sha256(b"abd").hexdigest()


# ------------------------------------------------------------------ corrupted copies and missing files
def _copy_dataset(name, dest):
    for f in REGISTRY[name].files:
        (dest / f.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(MIRROR / f.path, dest / f.path)


def test_corrupted_mirror_copy_via_kgrag_data_fails_clearly(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    _copy_dataset("family", mirror)
    facts = mirror / "family" / "facts.txt"
    data = bytearray(facts.read_bytes()); data[0] = ord("9") if data[0] != ord("9") else ord("8")  # same size, one byte off
    facts.write_bytes(bytes(data))
    monkeypatch.setenv("KGRAG_DATA", str(mirror)); monkeypatch.setenv("KGRAG_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ChecksumError) as e:
        fetch("family")
    msg = str(e.value)
    assert "family/facts.txt" in msg and str(facts) in msg
    assert "expected 137b7c79a58d49d4b0bf81321e3b25c9f570e88ab3ce437969cc8012c64b2f8e" in msg
    assert f"got {hashlib.sha256(bytes(data)).hexdigest()}" in msg
    assert "KGRAG_DATA" in msg and "DRUM/28587b5d" in msg
    with pytest.raises(ChecksumError):
        load_kg("family")  # loaders verify too
    facts.write_bytes(bytearray((MIRROR / "family" / "facts.txt").read_bytes()))  # repaired copy passes
    assert load_kg("family").num_triples == 17_615


def test_corrupted_download_says_delete_it(tmp_cfg):
    f = REGISTRY["nations"].file("nations/test.txt")
    local = tmp_cfg.downloads_dir / f.path
    local.parent.mkdir(parents=True); local.write_text("x\ty\tz\n")
    with pytest.raises(ChecksumError, match="Delete the corrupted download") as e:
        fetch_file(f, tmp_cfg)
    assert f"expected {f.sha256}" in str(e.value) and str(local) in str(e.value)


def test_missing_file_without_download_names_file_and_fix(tmp_cfg):
    with pytest.raises(DatasetUnavailableError, match="nations/train.txt is neither in the mirror") as e:
        fetch("nations", tmp_cfg, download=False)
    assert "KGRAG_DATA" in str(e.value)
    with pytest.raises(DatasetUnavailableError, match="codex-m split='test' needs codex/triples_codex-m_test.txt"):
        load_kg("codex-m", "test", cfg=tmp_cfg, download=False)  # an empty mirror, no download: the error names the file
    with pytest.raises(DatasetUnavailableError, match="no direct download"):
        fetch("freebase")


# ------------------------------------------------------------------ safe extraction
def _tar(path, members, mode="w:gz"):
    "members: (name, bytes) regular files, (name, '->target') symlinks, (name, '=>target') hard links."
    with tarfile.open(path, mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type = tarfile.SYMTYPE if data.startswith("->") else tarfile.LNKTYPE
                info.linkname = data[2:]
                tf.addfile(info)
            else:
                info.size = len(data); tf.addfile(info, io.BytesIO(data))
    return path


def _zip(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members:
            if isinstance(data, str):
                info = zipfile.ZipInfo(name); info.external_attr = (stat.S_IFLNK | 0o777) << 16
                zf.writestr(info, data[2:])
            else: zf.writestr(name, data)
    return path


def test_safe_extract_good_tar_and_zip(tmp_path):
    files = safe_extract(_tar(tmp_path / "a.tar.gz", [("d/x.txt", b"x"), ("d/ln", "->x.txt"), ("y.txt", b"y")]), tmp_path / "o1")
    assert (tmp_path / "o1" / "d" / "x.txt").read_bytes() == b"x" and (tmp_path / "o1" / "d" / "ln").read_bytes() == b"x"
    assert sorted(p.name for p in files) == ["x.txt", "y.txt"]
    safe_extract(_tar(tmp_path / "b.tar", [("z.txt", b"z")], mode="w"), tmp_path / "o2")
    assert (tmp_path / "o2" / "z.txt").read_bytes() == b"z"
    safe_extract(_zip(tmp_path / "c.zip", [("d/x.txt", b"zx")]), tmp_path / "o3")
    assert (tmp_path / "o3" / "d" / "x.txt").read_bytes() == b"zx"


@pytest.mark.parametrize("members,reason", [
    ([("../evil", b"x")], "'..'"),
    ([("ok/../../evil", b"x")], "'..'"),
    ([("/tmp/kgrag_evil_abs", b"x")], "absolute path"),
    ([("up", "->../../evil")], "outside the extraction folder"),
    ([("deep/up", "->../../evil")], "outside the extraction folder"),
    ([("abs", "->/etc/passwd")], "absolute path"),
    ([("hard", "=>../evil")], "outside the extraction folder"),
    ([("d", "->."), ("d/x", b"x")], "passes through a symlink"),
])
@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_safe_extract_refuses_escaping_members(tmp_path, members, reason, fmt):
    if fmt == "zip":
        if any(isinstance(d, str) and d.startswith("=>") for _, d in members): pytest.skip("zip has no hard links")
        archive = _zip(tmp_path / "bad.zip", members)
    else:
        archive = _tar(tmp_path / "bad.tar.gz", members)
    dest = tmp_path / "a" / "b" / "out"
    with pytest.raises(UnsafeArchiveError, match=reason) as e:
        safe_extract(archive, dest)
    assert archive.name in str(e.value) and "download it again" in str(e.value)
    assert not any(dest.rglob("*")), "nothing may be written when a member is refused"
    assert not (tmp_path / "a" / "evil").exists() and not Path("/tmp/kgrag_evil_abs").exists()


@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_safe_extract_refuses_to_write_through_a_symlink_already_in_the_folder(tmp_path, fmt):
    outside = tmp_path / "outside"; outside.mkdir()
    dest = tmp_path / "out"; dest.mkdir(); (dest / "d").symlink_to(outside)
    members = [("d/x.txt", b"x")]
    archive = _zip(tmp_path / "a.zip", members) if fmt == "zip" else _tar(tmp_path / "a.tar.gz", members)
    with pytest.raises(UnsafeArchiveError, match="existing symlink"): safe_extract(archive, dest)
    assert not (outside / "x.txt").exists()


def test_a_byte_changed_with_size_and_mtime_kept_is_detected(tmp_path):
    c = get_config(cache_dir=tmp_path / "cache")
    p = tmp_path / "facts.txt"; p.write_bytes(b"a\tr\tb\n")
    first = cached_sha256(p, c)
    st = p.stat()
    p.write_bytes(b"a\tr\tc\n"); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    assert cached_sha256(p, c) == file_sha256(p) != first


def test_safe_extract_rejects_non_archives(tmp_path):
    p = tmp_path / "x.tar.gz"; p.write_text("not an archive")
    with pytest.raises(UnsafeArchiveError, match="neither a tar nor a zip"):
        safe_extract(p, tmp_path / "out")


_segment = st.text(alphabet="abcxyz019_-", min_size=1, max_size=6)

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_segment, min_size=1, max_size=4), dotdot_at=st.integers(0, 4), fmt=st.sampled_from(["tar", "zip"]))
def test_safe_extract_property(tmp_path_factory, parts, dotdot_at, fmt):
    "Plain relative names land inside dest; the same names with one `..` segment inserted are refused."
    d = tmp_path_factory.mktemp("prop")
    name = "/".join(parts)
    make = _tar if fmt == "tar" else _zip
    out = safe_extract(make(d / f"ok.{fmt}", [(name, b"data")]), d / "ok")
    assert (d / "ok" / name).read_bytes() == b"data" and all(d / "ok" in p.resolve().parents for p in out)
    bad = "/".join(parts[:dotdot_at] + [".."] + parts[dotdot_at:])
    with pytest.raises(UnsafeArchiveError):
        safe_extract(make(d / f"bad.{fmt}", [(bad, b"data")]), d / "bad")


# ------------------------------------------------------------------ real download over loopback
@pytest.fixture
def http_server(tmp_path):
    "`python -m http.server` on 127.0.0.1 serving tmp_path/www; yields (base URL, folder)."
    www = tmp_path / "www"; www.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(www)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try: urllib.request.urlopen(base + "/", timeout=1).close(); break
        except OSError: time.sleep(0.05)
    try: yield base, www
    finally: proc.terminate(); proc.wait(10)


def test_download_extracts_and_verifies_archive_member(http_server, tmp_cfg):
    base, www = http_server
    payload = b"h\tr\tt\n"
    _tar(www / "small.tar.gz", [("pkg/data/a.txt", payload), ("pkg/b.txt", b"other")])
    good = DatasetFile("demo/a.txt", hashlib.sha256(payload).hexdigest(), f"{base}/small.tar.gz", member="data/a.txt")
    spec = DatasetSpec("demo", "kg", (good,), "test", "test", base)
    paths = fetch(spec, tmp_cfg)
    assert paths == {"demo/a.txt": tmp_cfg.downloads_dir / "demo" / "a.txt"}
    assert paths["demo/a.txt"].read_bytes() == payload
    assert (tmp_cfg.downloads_dir / "_archives" / "small.tar.gz").exists()
    assert read_triples(paths["demo/a.txt"]).values.tolist() == [["h", "r", "t"]]
    # a member whose content differs from the pinned hash is a checksum error naming the fix
    wrong = DatasetFile("demo/b.txt", "0" * 64, f"{base}/small.tar.gz", member="pkg/b.txt")
    with pytest.raises(ChecksumError, match="Delete the corrupted download") as e:
        fetch_file(wrong, tmp_cfg)
    assert f"got {hashlib.sha256(b'other').hexdigest()}" in str(e.value) and "expected " + "0" * 64 in str(e.value)
    assert f"and the archive {tmp_cfg.downloads_dir / '_archives' / 'small.tar.gz'}" in str(e.value)


def test_download_plain_file_with_pooch_hash_check(http_server, tmp_cfg):
    base, www = http_server
    (www / "q.json").write_bytes(b'[{"question": "q?", "answer": ["a"]}]')
    sha = hashlib.sha256((www / "q.json").read_bytes()).hexdigest()
    f = DatasetFile("demo/q.json", sha, f"{base}/q.json")
    path = fetch_file(f, tmp_cfg)
    assert read_json_records(path) == [{"question": "q?", "answer": ["a"]}]
    (www / "q.json").unlink()
    assert fetch_file(f, tmp_cfg) == path  # second call: from the downloads folder, no server needed
    (www / "r.json").write_bytes(b"[]")
    bad = DatasetFile("demo/r.json", "1" * 64, f"{base}/r.json")
    with pytest.raises(ChecksumError) as e:
        fetch_file(bad, tmp_cfg)
    assert "expected " + "1" * 64 in str(e.value) and hashlib.sha256(b"[]").hexdigest() in str(e.value)
    assert not (tmp_cfg.downloads_dir / "demo" / "r.json").exists()  # pooch deleted the bad download


def test_download_unpinned_file_is_recorded_then_verified(http_server, tmp_cfg):
    base, www = http_server
    (www / "u.txt").write_bytes(b"a\tb\tc\n")
    f = DatasetFile("demo/u.txt", None, f"{base}/u.txt")
    with pytest.warns(UserWarning, match="no pinned sha256"):
        path = fetch_file(f, tmp_cfg)
    seen = json.loads((tmp_cfg.cache_dir / "datasets" / "first_seen_sha256.json").read_text())
    assert seen["demo/u.txt"]["sha256"] == hashlib.sha256(b"a\tb\tc\n").hexdigest() and seen["demo/u.txt"]["size"] == 6
    path.write_bytes(b"a\tb\tX\n")
    with pytest.raises(ChecksumError, match="Delete the corrupted download"):
        fetch_file(f, tmp_cfg)


def test_download_of_malicious_archive_is_refused(http_server, tmp_cfg):
    base, www = http_server
    _tar(www / "evil.tar.gz", [("../../evil.txt", b"x"), ("a.txt", b"a")])
    f = DatasetFile("demo/a.txt", hashlib.sha256(b"a").hexdigest(), f"{base}/evil.tar.gz", member="a.txt")
    with pytest.raises(UnsafeArchiveError, match="evil.txt"):
        fetch_file(f, tmp_cfg)
    assert not (tmp_cfg.downloads_dir / "evil.txt").exists() and not (tmp_cfg.cache_dir / "evil.txt").exists()


def test_unreachable_download_names_kgrag_data(tmp_cfg):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]  # closed port: connection refused
    f = DatasetFile("demo/n.txt", "0" * 64, f"http://127.0.0.1:{port}/n.txt")
    with pytest.raises(DatasetUnavailableError, match="set KGRAG_DATA") as e:
        fetch_file(f, tmp_cfg)
    assert "demo/n.txt" in str(e.value) and f"127.0.0.1:{port}" in str(e.value)


# ------------------------------------------------------------------ KG loaders
def test_family_is_brink_family_complete():
    kg = load_kg("family")  # BRINK Table 3: Family-Complete 17,615 triples
    assert (kg.num_triples, kg.num_entities, kg.num_relations) == (17_615, 3_007, 12)
    assert load_kg("family", "facts").num_triples == 17_615
    assert load_kg("family", "union").num_triples == 28_356
    assert [load_kg("family", s).num_triples for s in ("train", "valid", "test")] == [5_868, 2_038, 2_835]


def test_drum_splits_are_disjoint_and_union_is_their_sum():
    for name, facts in (("family", 17_615), ("umls", 4_006), ("kinship", 6_375)):
        parts = {s: set(map(tuple, kg_frame(name, s)[["head", "relation", "tail"]].values)) for s in ("facts", "train", "valid", "test")}
        assert len(parts["facts"]) == facts
        assert sum(map(len, parts.values())) == len(set().union(*parts.values()))  # pairwise disjoint
    assert load_kg("umls").num_relations == 46 and load_kg("kinship").num_entities == 104


def test_fb15k237_counts_and_labels():
    assert len(kg_frame("fb15k237", "train")) == 272_115
    assert [len(kg_frame("fb15k237", s)) for s in ("valid", "test")] == [17_535, 20_466]
    kg = load_kg("fb15k237")
    assert (kg.num_triples, kg.num_entities, kg.num_relations) == (310_116, 14_541, 237)
    assert kg.entity_labels["/m/016ywr"] == "Jeremy Irons"
    assert kg.relation_labels["/music/artist/origin"] == "music artist origin"
    assert not any("\r" in x for x in kg.entities[:100])  # CRLF of ConvE's files stripped


def test_nations_and_codex_counts():
    assert [len(kg_frame("nations", s)) for s in ("train", "valid", "test")] == [1_592, 199, 201]
    assert load_kg("nations").num_triples == 1_992
    cs = load_kg("codex-s")
    assert (cs.num_triples, cs.num_entities, cs.num_relations) == (36_543, 2_034, 42)
    assert cs.relation_labels["P27"] == "country of citizenship" and cs.entity_labels == {}
    assert load_kg("codex-m", "train").num_triples == 185_584


def test_bad_triple_line_names_file_and_line(tmp_path):
    p = tmp_path / "t.txt"; p.write_text("a\tb\tc\na\tb\n")
    with pytest.raises(DatasetFormatError, match=r"t.txt: line 2 has 2 fields"):
        read_triples(p)


# ------------------------------------------------------------------ QA loaders
EXPECTED_QA = {"cwq": 1000, "cwq_ct0.4": 1000, "cwq_tog": 3531, "webqsp": 1000, "mintaka": 2000, "hotpotqa": 500,
               "hotpotqa_first100": 100, "scopecoe_2wiki": 661, "scopecoe_hotpotqa": 679, "nq_open": 3610, "2wiki_dev_records": 2}


@pytest.mark.parametrize("name,n", sorted(EXPECTED_QA.items()))
def test_qa_counts_and_answers(name, n):
    recs = load_qa(name)
    assert len(recs) == n and all(isinstance(r, QARecord) and r.dataset == name for r in recs)
    assert all(r.question and r.answers and all(isinstance(a, str) and a for a in r.answers) for r in recs)
    assert len({r.id for r in recs}) == n  # ids unique
    assert len(load_qa(name, limit=2)) == min(2, n)
    frame = to_frame(recs[:5])
    assert list(frame.columns) == ["id", "question", "answers", "topic_entities", "evidence", "evidence_ids", "context",
                                   "supporting_facts", "meta", "dataset"]


def test_gog_evidence_and_merges():
    ct = load_qa("cwq_ct0.4")
    assert sum(bool(r.evidence) for r in ct) == 810 and sum(len(r.evidence) for r in ct) == 4_366
    assert all(len(r.evidence) == len(r.evidence_ids) for r in ct)
    cwq = load_qa("cwq")
    assert [r.id for r in cwq] == [r.id for r in ct]
    assert "Sunni Islam" in cwq[4].answers and "Shia Islam" in cwq[4].answers  # full answer set from GoG ct_0
    w = load_qa("webqsp")
    assert sum(bool(r.evidence) for r in w) == 991
    assert w[0].evidence_ids[0] == ("m.078w2", "influence.influence_node.influenced_by", "m.03sbs")
    assert len(w[0].answers) == 10 and w[0].topic_entities == [{"id": "m.078w2", "name": "Samuel Taylor Coleridge"}]


def test_mintaka_mapping():
    m = {r.id: r for r in load_qa("mintaka")}
    assert sum(bool(r.topic_entities) for r in m.values()) > 1900
    counts = [r for r in m.values() if r.meta["complexity_type"] == "count"]
    assert len(counts) == 200 and all(r.answers[0] == str(r.meta["answer_num"]) for r in counts)
    yesno = [r for r in m.values() if r.meta["answer_type"] == "boolean"]
    assert yesno and all(set(r.answers) <= {"Yes", "No"} for r in yesno)


def test_hotpot_and_2wiki_context():
    hp = load_qa("hotpotqa")
    assert all(r.supporting_facts for r in hp)
    assert sum(len(r.context) == 10 for r in hp) == 495 and sum(not r.context for r in hp) == 2  # 2 records ship no context
    assert hp[0].id == "5a7166395542994082a3e814" and hp[0].supporting_facts[0] == ("Kansas Song", 0)
    two = load_qa("2wiki_dev_records")
    assert two[1].evidence == [("Aas Ka Panchhi", "publication date", "1961"), ("Phoolwari", "publication date", "1946")]
    assert two[1].evidence_ids == [] and two[1].topic_entities == [{"id": "Q4662676", "name": None}, {"id": "Q7188342", "name": None}]
    assert two[0].meta["type"] == "compositional" and len(two[0].context) == 10


def test_scopecoe_meta():
    for name in ("scopecoe_2wiki", "scopecoe_hotpotqa"):
        recs = load_qa(name)
        assert all({"CoE", "Senp_Non_CoE", "Word_Non_CoE", "irrelevant_info", "wrong_ans"} <= set(r.meta) for r in recs)
        assert all(r.meta["CoE"] and r.meta["wrong_ans"] and r.meta["irrelevant_info"] for r in recs)


def test_gog_cwq_topic_entities_in_fb15k237():
    ents = set(kg_frame("fb15k237")[["head", "tail"]].values.ravel())
    assert sum(topic_in_kg(load_qa("cwq"), ents)) == 474  # SOURCES.md "Useful overlaps"
    assert sum(topic_in_kg(load_qa("cwq"), load_kg("fb15k237"))) == 474


def test_missing_fields_are_empty_and_malformed_records_are_named():
    for fmt in D.QA_CONVERTERS:
        rec = parse_qa_records(fmt, [{"question": "q?"}])[0]
        assert rec.question == "q?" and rec.answers == [] and rec.evidence == [] and rec.context == []
        assert rec.topic_entities == [] and rec.supporting_facts == []
    with pytest.raises(DatasetFormatError, match=r"x.json: record 2 is malformed"):
        parse_qa_records("nq_open", [{"question": "a"}, {"question": "b"}, ["not", "a", "dict"]], source="x.json")
    with pytest.raises(DatasetFormatError, match=r"y.json: record 0.*not a \(head, relation, tail\)"):
        parse_qa_records("gog_cwq", [{"question": "a", "crucial_triples": [["a", "b"]]}], source="y.json")
    with pytest.raises(DatasetFormatError, match="expected a JSON list"):
        parse_qa_records("mintaka", {"question": "a"}, source="z.json")


def test_bad_jsonl_line_is_named(tmp_path):
    p = tmp_path / "d.jsonl"; p.write_text('{"question": "a"}\n{oops\n')
    with pytest.raises(DatasetFormatError, match=r"d.jsonl: line 2 \(record 1\)"):
        read_json_records(p)


def test_corpora():
    nq = load_corpus("nq_wiki_passages")
    assert len(nq) == 1000 and nq.id.is_unique and (nq.title.str.len() > 0).all() and (nq.text.str.len() > 0).all()
    w = load_corpus("2wiki_corpus")
    assert len(w) == 6119 and w.title.is_unique and list(w.columns) == ["id", "title", "text"]
    assert len(load_corpus("2wiki_corpus", limit=5)) == 5


# ------------------------------------------------------------------ mids
@given(st.from_regex(r"[mg]\.[0-9a-z_]{1,12}", fullmatch=True))
def test_mid_round_trip(mid):
    fb = mid_to_fb15k(mid)
    assert fb.startswith("/" + mid[0] + "/") and fb15k_to_mid(fb) == mid and mid_to_fb15k(fb) == fb
    assert mid_to_fb15k("ns:" + mid) == fb


@pytest.mark.parametrize("bad", ["Q42", "m/0abc", "", "m.", "/m/"])
def test_mid_rejects_non_mids(bad):
    with pytest.raises(ValueError, match="not a Freebase mid"):
        mid_to_fb15k(bad)
