"""The set-up files agree with each other: pyproject.toml and environment.yml name the same packages."""

from __future__ import annotations

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent

# conda-forge names some packages differently from PyPI.
CONDA_TO_PYPI = {"pytorch": "torch"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_packages() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in meta["dependencies"]}
    for extra in ("test", "browser"):
        names |= {_name(r) for r in meta["optional-dependencies"][extra]}
    return names


def _environment_packages() -> set[str]:
    import yaml  # PyYAML comes with JupyterLab (jupyter-events)

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        reqs = dep["pip"] if isinstance(dep, dict) else [dep]
        for req in reqs:
            name = _name(req)
            if name not in ("python", "pip"):
                names.add(CONDA_TO_PYPI.get(name, name))
    return names


def test_environment_yml_matches_pyproject():
    py, env = _pyproject_packages(), _environment_packages()
    assert py == env, (f"only in pyproject.toml: {sorted(py - env)}; "
                       f"only in environment.yml: {sorted(env - py)}")


def test_every_gpu_extra_is_a_cupy_build():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    assert _name(extras["cuda12"][0]) == "cupy-cuda12x"
    assert _name(extras["cuda13"][0]) == "cupy-cuda13x"


def test_ci_runs_make_test():
    text = (ROOT / ".ci" / "run").read_text()
    assert "make test" in text


def test_the_package_ships_the_measured_results():
    # the wheel's fp16lab/measured is the checkout's data/ (fp16lab.measure.provenance finds it there)
    assert (ROOT / "fp16lab" / "measured").resolve() == (ROOT / "data").resolve()
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["fp16lab.measured"]
    suffixes = {p.suffix for p in (ROOT / "data").iterdir() if p.is_file() and p.suffix}
    assert {f"*{s}" for s in suffixes} <= set(shipped), (suffixes, shipped)


def test_the_install_stamp_follows_torch_spec_and_extras():
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\): pyproject.toml \$\(WANTED\)$", text, re.M)
    assert "$(TORCH_SPEC) [$(EXTRAS)]" in text
