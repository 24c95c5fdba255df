"""Tests of kgrag_nb.serve: vllm argv, the embedded llama.cpp server (start, reuse, refusal, death, stop)."""
import json, shutil, socket, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from kgrag_nb.config import EMBEDDED_MODEL_ALIAS, get_config
from kgrag_nb.serve import (EmbeddedServer, free_port, llm_endpoint, port_in_use, served_models, serve_vllm,
                            vllm_command)


def test_vllm_command_argv():
    assert vllm_command("meta-llama/Llama-3.1-8B-Instruct") == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1", "--port", "8000", "--tensor-parallel-size", "1"]
    assert vllm_command("Qwen/Qwen2.5-32B-Instruct", tensor_parallel_size=4, host="0.0.0.0", port=9000,
                        extra=["--max-model-len", 8192, "--api-key", "k"])[3:] == [
        "--host", "0.0.0.0", "--port", "9000", "--tensor-parallel-size", "4", "--max-model-len", "8192", "--api-key", "k"]
    with pytest.raises(ValueError, match="GPUs"): vllm_command("m", tensor_parallel_size=0)
    with pytest.raises(ValueError, match="model"): vllm_command("")


@pytest.mark.skipif(shutil.which("vllm") is not None, reason="vllm is installed: serve_vllm would exec it")
def test_serve_vllm_without_vllm_explains_the_fix():
    with pytest.raises(RuntimeError, match=r'pip install -e "\.\[gpu\]"'): serve_vllm("m")


def test_embedded_server_defaults_and_idempotent_stop(tmp_path):
    cfg = get_config(cache_dir=tmp_path)
    s = EmbeddedServer(cfg)
    assert (s.url, s.model, s.log_path) == (cfg.embedded_url, EMBEDDED_MODEL_ALIAS, tmp_path / "logs" / f"llama_server_{cfg.embedded_port}.log")
    s.stop(); s.stop()
    assert not s.running


def test_llm_endpoint_prefers_configured_url():
    with llm_endpoint(get_config(llm_url="http://gpu-node:8000/v1")) as url: assert url == "http://gpu-node:8000/v1"


def test_port_taken_by_another_program_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); s.listen(); port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        with pytest.raises(RuntimeError, match=f"port {port}.*another program"):
            EmbeddedServer(get_config(cache_dir=tmp_path), port=port).start()


def test_port_serving_another_model_is_refused(tmp_path):
    class Models(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            data = json.dumps({"object": "list", "data": [{"id": "other-model", "object": "model"}]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        port = httpd.server_address[1]
        assert served_models(f"http://127.0.0.1:{port}/v1") == ["other-model"]
        with pytest.raises(RuntimeError, match="other-model"): EmbeddedServer(get_config(cache_dir=tmp_path), port=port).start()
    finally: httpd.shutdown(); httpd.server_close()


def test_server_death_reports_log_tail(tmp_path):
    pytest.importorskip("llama_cpp.server")
    bad = tmp_path / "broken.gguf"; bad.write_bytes(b"\x00" * 64)
    s = EmbeddedServer(get_config(cache_dir=tmp_path), port=free_port(), model_path=bad, startup_timeout=60)
    with pytest.raises(RuntimeError, match="exited with code") as e: s.start()
    assert "broken.gguf" in str(e.value) and str(s.log_path) in str(e.value)
    assert not s.running


@pytest.mark.llm
def test_embedded_server_serves_and_is_reused(embedded_server, tmp_path):
    assert served_models(embedded_server.url) == [EMBEDDED_MODEL_ALIAS]
    other = EmbeddedServer(get_config(cache_dir=tmp_path), port=embedded_server.port)
    with other:
        assert other.reused and other.proc is None and other.url == embedded_server.url
    assert not other.running and port_in_use("127.0.0.1", embedded_server.port)  # the reuser did not stop it
    cfg = get_config(cache_dir=tmp_path, embedded_port=embedded_server.port)
    with llm_endpoint(cfg) as url: assert url == embedded_server.url
    r = httpx.post(f"{embedded_server.url}/completions", timeout=60,
                   json=dict(model=EMBEDDED_MODEL_ALIAS, prompt="Q: What is 2+2?\nA:", max_tokens=4, temperature=0))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.llm
def test_start_and_clean_stop(tmp_path):
    pytest.importorskip("llama_cpp.server")
    s = EmbeddedServer(get_config(), port=free_port(), log_path=tmp_path / "s.log")
    t0 = time.perf_counter()
    s.start()
    proc = s.proc
    assert s.running and served_models(s.url) == [EMBEDDED_MODEL_ALIAS]
    s.stop(); s.stop()
    assert proc.returncode is not None and not port_in_use("127.0.0.1", s.port)
    assert time.perf_counter() - t0 < 120
