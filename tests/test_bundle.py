"""Replayable run bundles: `kgrag bundle` writes one archive of a run (manifest, notebooks, tables, figures, experiment
results, exactly the LLM cache rows its key logs name, checksums); `kgrag reproduce --bundle` re-renders the run in a
fresh clone with no model server, sending 0 requests, every table byte-identical. A row the bundle lacks is an error
naming the notebook and the request, never a live call; a bundle carries no secret and no absolute path of its machine."""
import hashlib, io, json, os, shutil, subprocess, sys, tarfile, time
from pathlib import Path

import pytest

from kgrag_nb.bundle import (REPLAY_URL, BundleError, BundleReplayError, bundle_run, path_placeholders, read_bundle,
                             replay_bundle, sanitize_text, write_archive)
from kgrag_nb.config import get_config
from kgrag_nb.reproduce import reproduce

ONLY = "awakening_table3,awakening_closed_book"  # one cheap LLM experiment (awakening_task2) with its artefact, and an LLM artefact
SECRET = "sk-kgrag-bundle-secret-0123456789"


def _cfg(tmp: Path, **kw):
    real = get_config()
    return get_config(root=kw.pop("root", real.root), data_dir=real.data_dir, cache_dir=tmp / "cache", runs_dir=tmp / "runs",
                      figures_dir=tmp / "figures", **kw)


def _rewrite(members: dict, out: Path) -> Path:
    "A bundle of `members` with a fresh SHA256SUMS (a consistent edit, as a bundle made from another cache would be)."
    members = {k: v for k, v in members.items() if k != "SHA256SUMS"}
    members["SHA256SUMS"] = "".join(f"{hashlib.sha256(members[n]).hexdigest()}  {n}\n" for n in sorted(members)).encode()
    return write_archive(out, members)


def _tables(members: dict) -> dict:
    return {n: d for n, d in members.items() if n.startswith("figures/") and n.endswith((".csv", ".md", ".tex"))}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, embedded_server):
    "A real tiny run on the embedded server (API key set, as a user's would be), and its bundle."
    tmp = tmp_path_factory.mktemp("bundle")
    cfg = _cfg(tmp)
    os.environ["OPENAI_API_KEY"] = SECRET
    try:
        m = reproduce(profile="tiny", only=ONLY, llm_url=embedded_server.url, cfg=cfg, progress=False, run_id="tiny-b")
        assert m["failed"] == [] and m["skipped"] == [], [e.get("error") for e in m["experiments"] + m["artifacts"]]
        t0 = time.time()
        b = bundle_run("tiny-b", tmp / "tiny-b.tar.gz", cfg=cfg)
        b["bundle_s"] = round(time.time() - t0, 2)
    finally:
        del os.environ["OPENAI_API_KEY"]
    return dict(cfg=cfg, tmp=tmp, manifest=m, bundle=b)


@pytest.mark.llm
def test_bundle_holds_exactly_the_rows_the_run_used(tiny):
    b, cfg, m = tiny["bundle"], tiny["cfg"], tiny["manifest"]
    info, members = read_bundle(b["out"])
    logged = set()
    for f in [*(cfg.runs_dir / "tiny-b").glob("*/*.keys")]: logged |= set(f.read_text().split())
    rows = [json.loads(l) for l in members["llm_rows.jsonl"].decode().splitlines()]
    assert {r[0] for r in rows} == logged and len(rows) == len(logged) > 0  # every logged key once, nothing else
    assert info["missing_rows"] == [] and info["stale_outputs"] == [] and info["model"] == m["model"]
    assert set(info["experiments"]) == {"awakening_task2"} and info["experiments"]["awakening_task2"]["needs_llm"] is True
    assert "run/experiments/awakening_task2.keys" in members and "run/artifacts/awakening_closed_book.keys" in members
    assert any(n.startswith("experiments/awakening_task2/") and n.endswith("_SUCCESS.json") for n in members)
    assert _tables(members) and "run/notebooks/awakening_closed_book.ipynb" in members
    print(f"\ntiny bundle: {b['size']} bytes, {b['members']} members, {b['llm_rows']} LLM rows, made in {b['bundle_s']} s")


@pytest.mark.llm
def test_bundle_carries_no_path_of_the_machine_and_no_secret(tiny):
    "The archive (decompressed, every member, binary ones too) names neither the checkout, $HOME, the run's folders nor"
    " the API key; a URL's password in a run file is dropped; a leak that survives is refused before anything is written."
    cfg, tmp = tiny["cfg"], tiny["tmp"]
    run2 = cfg.runs_dir / "tiny-leak"
    shutil.copytree(cfg.runs_dir / "tiny-b", run2)
    (run2 / "artifacts" / "note.json").write_text(json.dumps({"url": "https://ann:pw-0123456789@host:8000/v1", "where": str(cfg.root / "nbs")}))
    os.environ["OPENAI_API_KEY"] = SECRET
    try: b = bundle_run("tiny-leak", tmp / "tiny-leak.tar.gz", cfg=cfg)
    finally: del os.environ["OPENAI_API_KEY"]
    for path in (tiny["bundle"]["out"], b["out"]):
        with tarfile.open(path, "r:gz") as tar: raw = b"".join(tar.extractfile(x).read() for x in tar if x.isfile())
        for needle in (str(get_config().root), str(Path.home()), str(tmp), str(cfg.data_dir), SECRET, "pw-0123456789"):
            assert needle.encode() not in raw, (path.name, needle)
    note = json.loads(read_bundle(b["out"])[1]["run/artifacts/note.json"])
    assert note == {"url": "https://host:8000/v1", "where": "$KGRAG_HOME/nbs"}
    (run2 / "artifacts" / "blob.bin").write_bytes(b"\x00\x01" + str(cfg.root).encode() + b"/x\x00")  # not text: cannot be rewritten
    with pytest.raises(BundleError, match=r"run/artifacts/blob.bin: a path of this machine \(\$KGRAG_HOME\)"):
        bundle_run("tiny-leak", tmp / "refused.tar.gz", cfg=cfg)
    assert not (tmp / "refused.tar.gz").exists()


def _clone(root: Path, dest: Path) -> Path:
    "A fresh clone of the checkout's HEAD with its uncommitted changes copied in (CI's clean checkout has none)."
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(root), str(dest)], check=True)
    ls = lambda *o: [p for p in subprocess.run(["git", "-C", str(root), "ls-files", "-z", *o], capture_output=True, text=True,
                                              check=True).stdout.split("\0") if p]
    for rel in ls("-m", "-o", "--exclude-standard"):
        if (root / rel).is_file(): (dest / rel).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(root / rel, dest / rel)
    for rel in ls("-d"): (dest / rel).unlink(missing_ok=True)
    return dest


@pytest.mark.llm
def test_replay_in_a_fresh_clone_sends_nothing_and_renders_identical_tables(tiny):
    "`kgrag reproduce --bundle FILE` in a fresh clone (its own package, runs, figures and cache; the data mirror as"
    " KGRAG_DATA): 0 requests, no server, every bundled table byte for byte, the LLM experiment rerun from the rows."
    cfg, tmp = tiny["cfg"], tiny["tmp"]
    clone = _clone(get_config().root, tmp / "clone")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KGRAG_") and k != "OPENAI_API_KEY"}
    env.update(PYTHONPATH=str(clone), KGRAG_HOME=str(clone), KGRAG_DATA=str(cfg.data_dir))  # the mirror beside a real clone
    where = subprocess.run([sys.executable, "-c", "import kgrag_nb; print(kgrag_nb.__file__)"], env=env, cwd=clone,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(clone)), where  # the clone's package, not the checkout's
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "kgrag_nb.cli", "reproduce", "--bundle", str(tiny["bundle"]["out"]), "--run-id", "replayed",
                        "--rerun-experiments"], env=env, cwd=clone, capture_output=True, text=True, timeout=1800)
    wall = round(time.time() - t0, 1)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = json.loads((clone / "runs" / "replayed" / "manifest.json").read_text())
    assert m["llm_usage"].get("requests", 0) == 0 and m["llm_url"] == REPLAY_URL and m["config"]["llm_cache_mode"] == "replay"
    assert [(e["experiment"], e["status"]) for e in m["experiments"]] == [("awakening_task2", "computed")]  # rerun, from the rows
    _, members = read_bundle(tiny["bundle"]["out"])
    hits = m["llm_usage"].get("cache_hits", 0)
    assert hits >= len(members["llm_rows.jsonl"].splitlines()) > 0  # every answer came from the bundled rows
    tables = _tables(members)
    for name, data in tables.items():
        assert (clone / name).read_bytes() == data, name  # the clone's figures/<artefact>/<table>
    assert not list((clone / ".cache").glob("logs/llama_server_*"))  # no server was started
    print(f"\nreplay in a fresh clone: {wall} s, {len(tables)} tables byte-identical, {hits} cache hits, 0 requests\n{p.stdout[-400:]}")
    # the default replay re-renders from the bundled experiment results (read, not rerun): the same tables, strictly
    for name in tables: (clone / name).unlink()
    p = subprocess.run([sys.executable, "-m", "kgrag_nb.cli", "reproduce", "--bundle", str(tiny["bundle"]["out"]), "--run-id", "rendered"],
                       env=env, cwd=clone, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = json.loads((clone / "runs" / "rendered" / "manifest.json").read_text())
    assert m["llm_usage"].get("requests", 0) == 0 and [e["status"] for e in m["experiments"]] != ["computed"]
    for name, data in tables.items(): assert (clone / name).read_bytes() == data, name


@pytest.mark.llm
def test_a_row_missing_from_the_bundle_names_the_notebook_and_the_request(tiny, tmp_path):
    "Before anything runs (a logged key without its row), and inside the notebook (a request no key log names: the code"
    " asks something the run never did): the error names the notebook and the request; nothing is sent."
    _, members = read_bundle(tiny["bundle"]["out"])
    rows = members["llm_rows.jsonl"].decode().splitlines(keepends=True)
    keys = members["run/artifacts/awakening_closed_book.keys"].decode().split()
    dropped = [r for r in rows if json.loads(r)[0] != keys[0]]
    assert len(dropped) == len(rows) - 1
    cfg = _cfg(tmp_path)
    pre = _rewrite({**members, "llm_rows.jsonl": "".join(dropped).encode()}, tmp_path / "pre.tar.gz")
    with pytest.raises(BundleReplayError, match=rf"nbs/studies/awakening/artefacts/awakening_closed_book.ipynb \(awakening_closed_book\) needs LLM request {keys[0]}"):
        replay_bundle(pre, cfg=cfg, progress=False)
    assert not cfg.runs_dir.exists()  # nothing ran
    info = json.loads(members["bundle.json"]); info["only"] = "awakening_closed_book"  # the artefact alone: a short replay
    log = "".join(f"{k}\n" for k in keys[1:]).encode()
    inside = _rewrite({**members, "bundle.json": json.dumps(info).encode(), "llm_rows.jsonl": "".join(dropped).encode(),
                       "run/artifacts/awakening_closed_book.keys": log}, tmp_path / "inside.tar.gz")
    with pytest.raises(BundleReplayError) as err:
        replay_bundle(inside, cfg=cfg, progress=False, run_id="missing-row")
    msg = str(err.value)
    assert "nbs/studies/awakening/artefacts/awakening_closed_book.ipynb (awakening_closed_book) needed an LLM request the bundle does not hold" in msg, msg
    assert "CacheMissError: replay mode: no cached" in msg and "prompt" in msg, msg
    m = json.loads((cfg.runs_dir / "missing-row" / "manifest.json").read_text())
    assert m["llm_usage"].get("requests", 0) == 0


def test_a_changed_member_or_a_foreign_file_is_refused(tmp_path):
    (tmp_path / "x.tar.gz").write_bytes(b"not a bundle")
    with pytest.raises(BundleError, match="not a readable .tar.gz"): read_bundle(tmp_path / "x.tar.gz")
    good = {"bundle.json": json.dumps({"format": 1}).encode(), "llm_rows.jsonl": b'["k", null, "{}", 0]\n'}
    path = _rewrite(good, tmp_path / "b.tar.gz")
    assert read_bundle(path)[0] == {"format": 1}
    with tarfile.open(path, "r:gz") as tar: members = {x.name: tar.extractfile(x).read() for x in tar}
    write_archive(tmp_path / "c.tar.gz", {**members, "llm_rows.jsonl": b'["k", null, "{\\"text\\": 1}", 0]\n'})
    with pytest.raises(BundleError, match="member llm_rows.jsonl does not match its sha256"): read_bundle(tmp_path / "c.tar.gz")
    write_archive(tmp_path / "d.tar.gz", {**members, "extra.txt": b"x"})
    with pytest.raises(BundleError, match="member extra.txt is not in SHA256SUMS"): read_bundle(tmp_path / "d.tar.gz")
    with pytest.raises(BundleError, match="no such file"): read_bundle(tmp_path / "none.tar.gz")


def test_sanitize_replaces_paths_at_component_ends_only():
    cfg = get_config(root="/srv/p", data_dir="/srv/d", cache_dir="/srv/p/.cache", runs_dir="/srv/p/runs", figures_dir="/srv/p/figures")
    ph = path_placeholders(cfg, home="/home/u")
    assert sanitize_text("/srv/p/.cache/x /srv/pp /srv/p. /home/u/y /home/user", ph) == "$KGRAG_CACHE/x /srv/pp $KGRAG_HOME. ~/y /home/user"


def test_cli_bundle_and_replay_options(tmp_path, capsys, monkeypatch):
    "`kgrag bundle` names an unknown run; `kgrag reproduce --bundle` refuses the options the bundle fixes and a missing file."
    from kgrag_nb.cli import main
    monkeypatch.setenv("KGRAG_RUNS", str(tmp_path / "runs"))
    assert main(["bundle", "--run", "nope", "--out", str(tmp_path / "b.tar.gz")]) == 1
    assert "--run 'nope': no " in capsys.readouterr().err
    assert main(["reproduce", "--bundle", str(tmp_path / "b.tar.gz"), "--only", "x*", "--set", "n=1"]) == 1
    assert "drop --only, --set" in capsys.readouterr().err
    assert main(["reproduce", "--bundle", str(tmp_path / "b.tar.gz")]) == 1
    assert "no such file; make one with `kgrag bundle" in capsys.readouterr().err
