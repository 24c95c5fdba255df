"""`kgrag doctor` (issue 20 item 4): the disassembly scanner on hand-counted objdump snippets and on real assembled
instructions, redaction of secrets, the data mirror check, and the real `kgrag doctor` command in a subprocess.
Tests that start the embedded llama.cpp server are marked `llm`."""
import json, os, shutil, signal, subprocess, sys
from io import StringIO
from pathlib import Path

import pytest

from kgrag_nb.config import get_config
from kgrag_nb.datasets import _MIRROR
from kgrag_nb.doctor import (NEEDS, SCAN_CATEGORIES, STATUSES, Check, check_completion, check_env, check_llama_library,
                             check_mirror, exit_reason, instruction_categories, print_doctor, run_doctor, scan_disassembly,
                             scan_library)

ROOT = Path(__file__).resolve().parents[1]


def counts(amx=0, avx512=0, fma=0, avx2=0): return {"amx": amx, "avx512": avx512, "fma": fma, "avx2": avx2}


# --- scan_disassembly on literal objdump snippets (counted by hand) ---

def test_scan_amx_snippet():
    text = """
0000000000045600 <ggml_amx_tile_mul>:
   45600:\tpush   %rbp
   45601:\ttilezero %tmm0
   45606:\ttdpbusd %tmm3,%tmm2,%tmm0
   4560b:\ttdpfp16ps %tmm3,%tmm2,%tmm1
   45610:\tpop    %rbp
   45611:\tret
"""
    # tilezero (mnemonic), tdpbusd and tdpfp16ps (tdpb* / tdpfp16* prefixes): 3 AMX; nothing else is SIMD
    assert scan_disassembly(text) == counts(amx=3)


def test_scan_avx512_snippet():
    text = "   401000:\tvaddps %zmm1,%zmm2,%zmm3\n"
    assert scan_disassembly(text) == counts(avx512=1)


def test_scan_mixed_avx512_snippet():
    text = """
   10:\tvfmadd213ps %zmm2,%zmm1,%zmm0
   16:\tvmovdqu32 (%rax),%ymm1{%k2}
   1c:\tvpxor  %xmm20,%xmm20,%xmm20
   22:\tvpternlogd $0xff,%ymm0,%ymm0,%ymm0
   29:\tvaddps %ymm1,%ymm2,%ymm3
"""
    # avx512: zmm (1), {%k2} (2), xmm20 (3), EVEX-only vpternlogd (4); fma: line 1; avx2 (vp* on ymm): line 4 only
    # (vpxor here is on xmm registers; vmovdqu32 is not vp*; vaddps ymm is AVX)
    assert scan_disassembly(text) == counts(avx512=4, fma=1, avx2=1)


def test_scan_clean_avx2_snippet():
    "What a `portable` build holds: AVX2 and FMA, no AVX-512, no AMX."
    text = """
0000000000001000 <ggml_vec_dot_q8_0_q8_0>:
    1000:\tvpmaddubsw %ymm1,%ymm2,%ymm3
    1005:\tvpaddd %ymm3,%ymm4,%ymm4
    1009:\tvpbroadcastd 0x10(%rip),%ymm5        # 1020 <zmm_like_symbol>
    1012:\tvfmadd231ps %ymm4,%ymm5,%ymm6
    1017:\tvcvtdq2ps %ymm4,%ymm4
    101b:\tvperm2f128 $0x1,%ymm0,%ymm0,%ymm1
    1021:\tvzeroupper
    1024:\tret
"""
    # avx2: vpmaddubsw, vpaddd, vpbroadcastd = 3 (vperm2f128 is AVX); fma: 1; the `# ... <zmm_...>` comment is ignored
    assert scan_disassembly(text) == counts(fma=1, avx2=3)


def test_scan_ignores_labels_and_noise():
    text = "\n/lib.so:     file format elf64-x86-64\n\nDisassembly of section .text:\n\n0000000000001000 <tilezero_wrapper>:\n    1000:\tnop\n"
    assert scan_disassembly(text) == counts()


@pytest.mark.parametrize("insn, expected", [
    ("ldtilecfg (%rdi)", {"amx"}),
    ("sttilecfg 0x40(%rsp)", {"amx"}),
    ("tileloaddt1 (%rsi,%rax,1),%tmm4", {"amx"}),
    ("tdpbf16ps %tmm5,%tmm4,%tmm3", {"amx"}),
    ("kmovq  %k1,%rax", {"avx512"}),
    ("{evex} vpaddd %ymm1,%ymm2,%ymm3", {"avx512", "avx2"}),
    ("{vex} vpdpbusd %ymm1,%ymm2,%ymm3", {"avx2"}),  # AVX-VNNI (VEX): not AVX-512
    ("vpdpbusd %ymm1,%ymm2,%ymm3", {"avx512", "avx2"}),  # printed without {vex}: the EVEX (AVX512_VNNI) form
    ("vfnmsub132ss %xmm1,%xmm2,%xmm3", {"fma"}),
    ("vpsllvd %xmm1,%xmm2,%xmm3", {"avx2"}),  # AVX2 in its xmm form too
    ("vptest %ymm0,%ymm0", set()),
    ("vpaddd %xmm1,%xmm2,%xmm3", set()),  # AVX (128-bit integer)
    ("lock cmpxchg %rcx,(%rdx)", set()),
    ("mov    %rdi,%rax", set()),
])
def test_instruction_categories(insn, expected):
    assert instruction_categories(insn) == expected


# --- the objdump path on real machine code: assemble genuine AMX / AVX-512 / AVX2 instructions and scan the object ---

ASM = """
.text
.globl kernel
kernel:
    tilezero %tmm0
    tdpbssd %tmm2, %tmm1, %tmm0
    tilerelease
    vaddps %zmm1, %zmm2, %zmm3
    vpmaddubsw %ymm1, %ymm2, %ymm3
    vfmadd231ps %ymm1, %ymm2, %ymm3
    ret
"""


@pytest.fixture
def assembled(tmp_path):
    if not (shutil.which("as") and shutil.which("objdump")): pytest.skip("binutils (as, objdump) missing")
    src = tmp_path / "k.s"; src.write_text(ASM)
    obj = tmp_path / "libggml-cpu-fake.so"
    subprocess.run(["as", str(src), "-o", str(obj)], check=True)
    return obj


def test_scan_library_real_objdump(assembled):
    scan = scan_library(assembled)
    assert scan.instructions == 7
    assert scan.counts == counts(amx=3, avx512=1, fma=1, avx2=1)
    assert scan.examples["amx"] == ("tilezero %tmm0", "kernel")


def test_check_llama_library_fails_on_amx(assembled):
    rows = check_llama_library(libraries=[assembled], variant="portable")
    assert [r.status for r in rows] == ["FAIL"]
    assert "libggml-cpu-fake.so" in rows[0].name and "3 AMX instructions" in rows[0].detail
    assert "tools/llama_wheel.py --install" in rows[0].detail


def test_check_llama_library_variant_rules(tmp_path):
    "Without AMX: AVX-512 fails `portable`; FMA and AVX2 fail only `avx`; no record reports only."
    if not (shutil.which("as") and shutil.which("objdump")): pytest.skip("binutils (as, objdump) missing")
    src = tmp_path / "k.s"; src.write_text(".text\nk:\n vfmadd231ps %ymm1, %ymm2, %ymm3\n vpaddd %ymm1, %ymm2, %ymm3\n ret\n")
    obj = tmp_path / "libllama.so"; subprocess.run(["as", str(src), "-o", str(obj)], check=True)
    assert check_llama_library(libraries=[obj], variant="portable")[0].status == "ok"
    row = check_llama_library(libraries=[obj], variant="avx")[0]
    assert row.status == "FAIL" and "1 FMA" in row.detail and "1 AVX2" in row.detail
    assert check_llama_library(libraries=[obj], variant=None)[0].status == "ok"


def test_installed_llama_library_has_no_amx():
    "The installed build, as the doctor sees it: no AMX in any llama.cpp library (the SIGILL of issue 20)."
    pytest.importorskip("llama_cpp")
    if not shutil.which("objdump"): pytest.skip("objdump missing")
    rows = check_llama_library()
    assert rows and all("AMX instructions" not in r.detail for r in rows), rows


def test_exit_reason_names_a_real_signal():
    p = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    assert p.returncode == -signal.SIGILL
    assert exit_reason(p.returncode).startswith("killed by SIGILL")


# --- redaction ---

SECRET = "sk-doctor-test-9f8e7d6c5b4a"


def test_secret_env_never_printed(monkeypatch):
    monkeypatch.setenv("KGRAG_FAKE_API_KEY", SECRET)
    monkeypatch.setenv("KGRAG_FAKE_ENDPOINT", f"https://alice:{SECRET}@gpu.example:8000/v1?token={SECRET}&x=1")
    monkeypatch.setenv("KGRAG_LLM_URL", f"https://alice:{SECRET}@gpu.example:8000/v1?token={SECRET}&x=1")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    out = StringIO()
    print_doctor(check_env(), color=False, file=out)
    text = out.getvalue()
    assert SECRET not in text
    assert "env KGRAG_FAKE_API_KEY" in text and f"<set, {len(SECRET)} chars>" in text
    assert "env KGRAG_FAKE_ENDPOINT  <set, " in text  # not a known-safe setting: its value is not shown at all
    assert "https://gpu.example:8000/v1?token=***&x=***" in text  # KGRAG_LLM_URL: no userinfo, no query value


# --- data mirror and resources ---

def test_run_doctor_quick_mirror_ok():
    "The mirror at ../shared/data holds every registered file (sizes)."
    cfg = get_config()
    if not cfg.data_dir.is_dir(): pytest.skip(f"no data mirror at {cfg.data_dir}")
    rows = run_doctor(quick=True, completion=False)
    mirror = [r for r in rows if r.name == "data mirror"]
    assert [r.status for r in mirror] == ["ok"], mirror
    assert f"{len(_MIRROR)}/{len(_MIRROR)} files ok" in mirror[0].detail
    assert all(r.status in STATUSES for r in rows)
    assert not [r for r in rows if r.name in ("python", "numpy", "pandas", "cpu", "disk") and r.status == "FAIL"]


def test_mirror_hash_mismatch_named(tmp_path):
    "A same-size corrupted file passes --quick but fails the sha256 check, named."
    real = get_config()
    if not real.data_dir.is_dir(): pytest.skip(f"no data mirror at {real.data_dir}")
    mirror = tmp_path / "mirror"
    for rel in _MIRROR:
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).symlink_to(real.data_dir / rel)
    victim = "family/relations.txt"
    data = (real.data_dir / victim).read_bytes()
    (mirror / victim).unlink(); (mirror / victim).write_bytes(bytes([data[0] ^ 1]) + data[1:])
    cfg = get_config(data_dir=mirror, cache_dir=tmp_path / "cache")
    assert check_mirror(cfg, quick=True)[0].status == "ok"
    row = check_mirror(cfg)[0]
    assert row.status == "FAIL" and f"{victim} (sha256 differs)" in row.detail
    assert f"{len(_MIRROR) - 1}/{len(_MIRROR)} files ok" in row.detail


def test_needs_are_ordered():
    assert NEEDS["smoke"]["disk_gb"] < NEEDS["full"]["disk_gb"] and NEEDS["smoke"]["memory_gb"] < NEEDS["full"]["memory_gb"]


# --- the real command ---

def _kgrag() -> list[str]:
    "The installed console script (its entry points are what `kgrag doctor` needs), else `python -m kgrag_nb.cli`."
    script = Path(sys.executable).parent / "kgrag"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kgrag_nb.cli"]


def _run(args, **env):
    return subprocess.run(_kgrag() + args, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "NO_COLOR": "1", **env})


@pytest.mark.slow
def test_kgrag_doctor_quick_cli():
    p = _run(["doctor", "--quick", "--no-completion"], KGRAG_FAKE_SECRET=SECRET)
    lines = p.stdout.splitlines()
    assert lines[0].startswith("kgrag doctor — "), p.stdout + p.stderr
    assert any(l.split()[1:2] == ["cpu"] for l in lines[1:]), p.stdout  # the CPU line
    assert any(" llama build " in l for l in lines), p.stdout  # the llama build line
    assert SECRET not in p.stdout and "env KGRAG_FAKE_SECRET" in p.stdout
    fails = [l for l in lines if l.startswith("FAIL")]
    assert p.returncode == (1 if fails else 0), p.stdout + p.stderr
    assert lines[-1].endswith(f"{len(fails)} FAIL")


@pytest.mark.slow
def test_kgrag_doctor_json_and_exit_code(tmp_path):
    "A missing data mirror is a FAIL: exit code 1, and the JSON names it."
    p = _run(["doctor", "--quick", "--no-completion", "--json"], KGRAG_DATA=str(tmp_path / "no-mirror"))
    assert p.returncode == 1, p.stdout + p.stderr
    report = json.loads(p.stdout)
    rows = {r["name"]: r for r in report["checks"]}
    assert rows["data mirror"]["status"] == "FAIL" and "no-mirror" in rows["data mirror"]["detail"]
    assert {r["status"] for r in report["checks"]} <= set(STATUSES)


# --- real completions (the embedded llama.cpp server) ---

@pytest.mark.llm
def test_completion_embedded_server(monkeypatch):
    "The doctor starts its own server on a free port and gets one completion."
    pytest.importorskip("llama_cpp.server")
    monkeypatch.delenv("KGRAG_LLM_URL", raising=False)
    [row] = check_completion(get_config())
    assert row.status == "ok", row
    assert "'The capital of France is' ->" in row.detail and " ms" in row.detail


@pytest.mark.llm
def test_completion_remote_endpoint(embedded_server):
    "With llm_url set, the project's client asks it (no response cache)."
    [row] = check_completion(get_config(llm_url=embedded_server.url))
    assert row.status == "ok" and row.detail.startswith(embedded_server.url), row


def test_completion_unreachable_endpoint_fails():
    [row] = check_completion(get_config(llm_url="http://127.0.0.1:9/v1"), timeout=5)
    assert row.status == "FAIL" and "127.0.0.1:9" in row.detail


@pytest.mark.llm
def test_kgrag_doctor_full_cli():
    "`kgrag doctor --quick` with its real completion."
    pytest.importorskip("llama_cpp.server")
    p = _run(["doctor", "--quick"], KGRAG_LLM_URL="")
    line = [l for l in p.stdout.splitlines() if " completion " in l]
    assert line and line[0].startswith("ok"), p.stdout + p.stderr


# --- secrets: nothing the environment holds is printed, whatever row carries it (reliability round 3, item 6) ---
import base64, threading
from http.server import ThreadingHTTPServer

sys.path.insert(0, str(Path(__file__).parent))
from _http import JSONHandler  # noqa: E402
from kgrag_nb.doctor import doctor_json  # noqa: E402

PW, QKEY, QAUTH = "pw-Zq8Lr2Vx9Kt4", "qk-Hs7Wd3Mn6Pb1", "qa-Tf5Ng8Yc2Je0"
AUTH, LLM_PASS, API_KEY = "auth-Ru4Ek7Ow1Ia9", "pass-Gy6Ub3Xl8Dz5", "sk-Vo2Qi9Ah4Sm7"


class EchoAuth:
    "A loopback OpenAI-compatible server that echoes the Authorization header it receives (and the path) in its"
    " completion text, or in the body of an error when `status` is not 200: what a careless proxy does."
    def __init__(self, status=200):
        self.status, self.auth = status, []
        echo = self

        class Handler(JSONHandler):
            def do_GET(self):
                echo.auth.append(self.headers.get("Authorization"))
                self._send(200, {"object": "list", "data": [{"id": "echo", "object": "model", "owned_by": "me"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                said = f"Authorization: {self.headers.get('Authorization')} path {self.path}"
                echo.auth.append(self.headers.get("Authorization"))
                if echo.status != 200: return self._send(echo.status, {"error": {"message": f"denied; you sent {said}", "type": "x"}})
                self._send(200, {"id": "c", "object": "text_completion", "created": 0, "model": "echo",
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                                 "choices": [{"index": 0, "finish_reason": "stop", "text": said}]})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self): self.httpd.shutdown(); self.httpd.server_close()


def _forbidden(user="alice"):
    "Every secret of the test environment and the forms a server may echo it in (base64, Basic credentials)."
    raw = [PW, QKEY, QAUTH, AUTH, LLM_PASS, API_KEY, f"{user}:{PW}"]
    b64 = [base64.b64encode(s.encode()).decode().rstrip("=") for s in raw]
    return raw + b64 + [base64.urlsafe_b64encode(s.encode()).decode().rstrip("=") for s in raw]


@pytest.mark.parametrize("status", [200, 401])
def test_doctor_output_holds_no_secret(monkeypatch, status):
    "The completion row printed `?api_key=` twice, KGRAG_AUTH / KGRAG_LLM_PASS / `?auth=` in full, and the server's"
    " echo of the Authorization header (base64 of user:password): every printed or returned text is scrubbed."
    srv = EchoAuth(status)
    try:
        url = f"http://alice:{PW}@127.0.0.1:{srv.port}/v1?api_key={QKEY}&auth={QAUTH}"
        monkeypatch.setenv("KGRAG_LLM_URL", url)
        monkeypatch.setenv("KGRAG_AUTH", AUTH)
        monkeypatch.setenv("KGRAG_LLM_PASS", LLM_PASS)
        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        monkeypatch.setenv("KGRAG_PROFILE", "smoke")
        cfg = get_config()
        rows = check_completion(cfg, timeout=10) + check_env(cfg)
    finally: srv.close()
    assert any(a and a.startswith(("Basic ", "Bearer ")) for a in srv.auth), srv.auth  # the server did see credentials
    out = StringIO(); print_doctor(rows, color=False, file=out)
    text = out.getvalue() + json.dumps(doctor_json(rows)) + repr(rows)
    leaked = [s for s in _forbidden() if s in text]
    assert not leaked, (leaked, text)
    comp = next(r for r in rows if r.name == "completion")
    assert f"127.0.0.1:{srv.port}" in comp.detail and (comp.status == "ok") == (status == 200), comp
    env = {r.name: r.detail for r in rows}
    assert env["env KGRAG_AUTH"] == f"<set, {len(AUTH)} chars>" and env["env KGRAG_LLM_PASS"] == f"<set, {len(LLM_PASS)} chars>"
    assert env["env KGRAG_PROFILE"] == "smoke"  # a known-safe setting is shown
    assert env["env KGRAG_LLM_URL"] == f"http://127.0.0.1:{srv.port}/v1?api_key=***&auth=***"


def test_any_row_is_scrubbed(monkeypatch):
    "Rows made anywhere (a new check, an error text) cannot carry a secret of the environment: Check scrubs itself."
    monkeypatch.setenv("KGRAG_WEIRD_SETTING", "opaque-Va1ue-77x")
    monkeypatch.setenv("HF_TOKEN", "hf_Kd93jsLq02mZ")
    basic = base64.b64encode(b"bob:opaque-Va1ue-77x").decode()
    r = Check("x", "FAIL", f"server said: opaque-Va1ue-77x / Basic {basic} / token hf_Kd93jsLq02mZ / https://u:p4ss@h/v1?k=v")
    assert "opaque-Va1ue-77x" not in r.detail and basic not in r.detail and "hf_Kd93jsLq02mZ" not in r.detail
    assert "p4ss" not in r.detail and "k=***" in r.detail and r.detail.startswith("server said: ***")


# --- the llama.cpp library llama_cpp loads: LLAMA_CPP_LIB_PATH (reliability round 3, item 6) ---
from kgrag_nb.doctor import check_llama_build, llama_libraries  # noqa: E402


def _installed_lib_dir() -> Path:
    spec = pytest.importorskip("importlib.util").find_spec("llama_cpp")
    if spec is None: pytest.skip("llama-cpp-python is not installed")
    return Path(spec.origin).parent / "lib"


def test_broken_llama_library_names_cause_and_fix(tmp_path, monkeypatch):
    "libllama.so without the libggml it needs (a half-copied build): the sysinfo row showed a traceback fragment"
    " (`p/llama_cpp.py\", line 43, in <module>`); it names the exception, the missing .so and the rebuild command."
    lib = _installed_lib_dir() / "libllama.so"
    if not lib.exists(): pytest.skip(f"no {lib}")
    shutil.copy(lib, tmp_path / "libllama.so")  # its RUNPATH ($ORIGIN) finds no libggml.so.0 here
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    row = check_llama_build(cpu={})[-1]
    assert row.name == "llama sysinfo" and row.status == "FAIL", row
    assert "RuntimeError: Failed to load shared library" in row.detail, row.detail
    assert "libggml" in row.detail and "cannot open shared object file" in row.detail, row.detail
    assert "LLAMA_CPP_LIB_PATH" in row.detail and "python tools/llama_wheel.py --install" in row.detail, row.detail
    assert 'line 43' not in row.detail and "Traceback" not in row.detail


def test_binary_scan_follows_llama_cpp_lib_path(assembled, tmp_path, monkeypatch):
    "With LLAMA_CPP_LIB_PATH set, llama_cpp loads libllama.so (and, by its RUNPATH, libggml*) from there: the scan"
    " checked the package's own copies instead and missed an AMX build in the override."
    _installed_lib_dir()
    d = tmp_path / "override"; d.mkdir()
    shutil.copy(assembled, d / "libggml-cpu.so"); shutil.copy(assembled, d / "libllama.so.0")  # one file twice: scanned once
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(d))
    libs = llama_libraries()
    assert libs and all(p.parent == d for p in libs), libs
    rows = check_llama_library(variant="portable")
    assert [r.status for r in rows] == ["FAIL"] and str(d) in rows[0].detail and "3 AMX instructions" in rows[0].detail, rows
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH")
    assert all(d not in p.parents for p in llama_libraries())


from hypothesis import given, settings, strategies as st  # noqa: E402
from kgrag_nb.doctor import env_secrets, scrub  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(secret=st.text(st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="*"), min_size=8, max_size=40),
       user=st.text("abcdefghij", min_size=1, max_size=8), name=st.sampled_from(["KGRAG_AUTH", "KGRAG_LLM_PASS", "HF_TOKEN", "MY_API_KEY"]))
def test_scrub_hides_a_secret_in_every_form(secret, user, name):
    secrets = env_secrets({name: secret, "KGRAG_PROFILE": "smoke"})
    basic = base64.b64encode(f"{user}:{secret}".encode()).decode()
    text = scrub(f"got {secret} / Basic {basic} / {basic} / {base64.b64encode(secret.encode()).decode()} / smoke", secrets)
    assert secret not in text and basic not in text and base64.b64encode(secret.encode()).decode().rstrip("=") not in text, text
    assert text.endswith("/ smoke")  # a safe setting's value is left alone
