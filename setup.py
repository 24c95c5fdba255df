"""Packaging from settings.ini (nbdev 2 layout) with extras: cpu, gpu, dev."""
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini", encoding="utf-8")
c = cfg["DEFAULT"]
req = lambda key: c.get(key, "").split()

setuptools.setup(
    name=c["lib_name"], version=c["version"], description=c["description"],
    author=c["author"], author_email=c["author_email"], license="Apache-2.0",
    url=c["git_url"], packages=setuptools.find_packages(include=["kgrag_nb", "kgrag_nb.*"]),
    include_package_data=True, package_data={"kgrag_nb": ["papers/*.csv", "papers/*.yaml", "rehearsal/*.csv"]},  # paper numbers (kgrag_nb.papers), shipped rehearsal records (kgrag_nb.plan)
    python_requires=">=" + c["min_python"],
    install_requires=req("requirements"),
    extras_require={"cpu": req("cpu_requirements"), "gpu": req("gpu_requirements"), "dev": req("dev_requirements")},
    entry_points={"console_scripts": req("console_scripts"), "kgrag_nb.studies": req("study_modules"),
                  "jupyter_client.kernel_provisioners": req("kernel_provisioners"), "nbdev": [f"{c['lib_path']}={c['lib_path']}._modidx:d"]},
    zip_safe=False,
)
