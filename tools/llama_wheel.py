#!/usr/bin/env python3
"""Build llama-cpp-python with explicit, portable CPU flags into a wheel folder keyed by those flags, and install it.

Why this exists (issue 20): pip compiles llama-cpp-python from its sdist with llama.cpp's default `GGML_NATIVE=ON`
(`-march=native`). On a Xeon with AMX that build runs AMX tile instructions in worker threads and dies with SIGILL on
the first completion; and pip caches the compiled wheel under the sdist's name, not its build flags, so a machine that
once built a native wheel (or a pip cache copied from another CPU) reuses it forever. Here the wheel is built with the
flags below into `<cache>/llama_cpp_python-<version>-<variant>-<key>/`, where `key` hashes version, flags, Python tag and
platform, and pip never sees it in its own wheel cache (`--no-cache-dir`), so no other build can shadow it.

Variants (chosen by measurement, see docs/llama_build.md):
- `portable` (default on CPUs with AVX2): x86-64 with SSE4.2, AVX, AVX2, BMI2, FMA, F16C; no AVX-512, no AMX.
- `avx` (automatic fallback when the CPU has no AVX2): SSE4.2 + AVX only; slower, runs on any x86-64 CPU since 2011.
- `native` (only for measurement, `--variant native`): `-march=native`, what pip builds by default. Never the default.

Standard library only: it runs before the package and its requirements are installed (`make setup`).
"""
from __future__ import annotations

import argparse, hashlib, json, os, platform, shutil, subprocess, sys, sysconfig, tempfile
from pathlib import Path

VERSION = "0.3.36"  # keep equal to settings.ini's cpu_requirements pin
PACKAGE = "llama-cpp-python"
_NO_AMX = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
_NO_AVX512 = ["-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF"]
VARIANTS = {
    "portable": ["-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_BMI2=ON",
                 "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX_VNNI=OFF", *_NO_AVX512, *_NO_AMX],
    "avx": ["-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=OFF", "-DGGML_BMI2=OFF",
            "-DGGML_FMA=OFF", "-DGGML_F16C=OFF", "-DGGML_AVX_VNNI=OFF", *_NO_AVX512, *_NO_AMX],
    "native": ["-DGGML_NATIVE=ON"],
}
# the instruction sets each variant's CPU library may contain (kgrag doctor / tests check the binary against this)
CLAIMED_ISA = {"portable": ["sse4.2", "avx", "avx2", "bmi2", "fma", "f16c"], "avx": ["sse4.2", "avx"], "native": ["native"]}
BUILD_RECORD = "kgrag-llama-build.json"  # written into sys.prefix of the environment it installs into


def cpu_flags() -> set[str]:
    "The CPU's feature flags from /proc/cpuinfo (empty set where there is none)."
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def default_variant(flags: set[str] | None = None) -> str:
    "`portable` where the CPU has AVX2 (or we cannot tell), else the `avx` fallback."
    flags = cpu_flags() if flags is None else flags
    return "avx" if flags and "avx2" not in flags else "portable"


def build_key(variant: str, extra: str = "") -> str:
    "Hash of everything that makes two wheels differ: version, CMake flags, Python tag, platform."
    spec = {"package": PACKAGE, "version": VERSION, "cmake_args": VARIANTS[variant] + extra.split(),
            "python": sys.implementation.cache_tag, "platform": sysconfig.get_platform(), "machine": platform.machine()}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    "KGRAG_WHEEL_CACHE, else `kgrag-wheels/` inside pip's cache folder (kept wherever pip's cache is kept warm)."
    env = os.environ.get("KGRAG_WHEEL_CACHE")
    if env:
        return Path(env).expanduser()
    pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pip")
    return Path(pip_cache) / "kgrag-wheels"


def wheel_dir(variant: str, cache: Path, extra: str = "") -> Path:
    return cache / f"llama_cpp_python-{VERSION}-{variant}-{build_key(variant, extra)}"


def build(variant: str, cache: Path, extra: str = "", jobs: int | None = None) -> Path:
    "The keyed wheel for `variant`, compiled (about 8 minutes on 2 cores) only when its folder holds none."
    folder = wheel_dir(variant, cache, extra)
    wheels = sorted(folder.glob("*.whl"))
    if wheels and (folder / "build.json").exists():
        print(f"llama_wheel: reusing {wheels[0]} (key {folder.name})", flush=True)
        return wheels[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmake_args = " ".join(VARIANTS[variant] + extra.split())
    env = dict(os.environ, CMAKE_ARGS=cmake_args, FORCE_CMAKE="1",
               CMAKE_BUILD_PARALLEL_LEVEL=str(jobs or os.cpu_count() or 1))
    print(f"llama_wheel: compiling {PACKAGE}=={VERSION} ({variant}) with CMAKE_ARGS='{cmake_args}' "
          f"into {folder} (about 8 minutes on 2 cores)", flush=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
        # --no-cache-dir: pip must neither reuse a wheel it cached from another build nor cache this one by sdist name
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", PACKAGE,
               f"{PACKAGE}=={VERSION}", "-w", tmp]
        subprocess.run(cmd, env=env, check=True)
        built = sorted(Path(tmp).glob("*.whl"))
        if not built:
            sys.exit(f"llama_wheel: pip wheel made no wheel in {tmp}")
        (Path(tmp) / "build.json").write_text(json.dumps(
            {"package": PACKAGE, "version": VERSION, "variant": variant, "cmake_args": cmake_args,
             "claimed_isa": CLAIMED_ISA[variant], "key": folder.name, "wheel": built[0].name}, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)  # atomic: a half-built folder is never taken for a finished one
        os.makedirs(tmp)  # TemporaryDirectory wants to remove it
    return sorted(folder.glob("*.whl"))[0]


def install(wheel: Path) -> None:
    "Install the keyed wheel (with the server extra) into this Python and record the build in sys.prefix."
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"{wheel}[server]"], check=True)
    record = json.loads((wheel.parent / "build.json").read_text())
    record["wheel_path"] = str(wheel)
    Path(sys.prefix, BUILD_RECORD).write_text(json.dumps(record, indent=1))
    print(f"llama_wheel: installed {wheel.name} ({record['variant']}); build recorded in {Path(sys.prefix, BUILD_RECORD)}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default=os.environ.get("KGRAG_LLAMA_VARIANT") or None,
                    help="default: portable on CPUs with AVX2, else avx (env KGRAG_LLAMA_VARIANT)")
    ap.add_argument("--extra-cmake-args", default=os.environ.get("KGRAG_LLAMA_CMAKE_ARGS", ""),
                    help="appended to the variant's flags and part of the key (env KGRAG_LLAMA_CMAKE_ARGS)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: KGRAG_WHEEL_CACHE or <pip cache>/kgrag-wheels")
    ap.add_argument("--install", action="store_true", help="install the wheel into this Python")
    ap.add_argument("--print-dir", action="store_true", help="print the keyed wheel folder and exit")
    a = ap.parse_args(argv)
    variant = a.variant or default_variant()
    if variant == "avx":
        print("llama_wheel: this CPU has no AVX2: building the slower `avx` fallback (SSE4.2 + AVX)", flush=True)
    cache = a.cache_dir or default_cache_dir()
    if a.print_dir:
        print(wheel_dir(variant, cache, a.extra_cmake_args))
        return
    wheel = build(variant, cache, a.extra_cmake_args)
    if a.install:
        install(wheel)
    else:
        print(wheel)


if __name__ == "__main__":
    main()
