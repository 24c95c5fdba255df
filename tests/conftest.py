"""Shared pytest fixtures and markers for kgrag_nb.

`embedded_server` starts the real llama.cpp server (Gemma-3-270M, CPU, loopback) once per test session on a free port;
tests that use it are marked `llm`. Deselect them with `pytest -m "not llm"`.
"""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "llm: needs the embedded llama.cpp server (real Gemma-3-270M on CPU)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory):
    "A running `EmbeddedServer` (attributes `.url`, `.model`, `.port`) shared by the whole session."
    pytest.importorskip("llama_cpp.server", reason='llama-cpp-python[server] missing: pip install -e ".[cpu]"')
    from kgrag_nb.config import get_config
    from kgrag_nb.serve import EmbeddedServer, embedded_model_path, free_port
    cfg = get_config()
    embedded_model_path(cfg)  # assemble the GGUF into the project cache once (shared across sessions)
    log = tmp_path_factory.mktemp("llama_server") / "server.log"
    with EmbeddedServer(cfg, port=free_port(), log_path=log) as srv:
        yield srv
