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
    for extra in ("test", "browser", "state16", "vision", "models"):  # what the set-up installs everywhere
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


def test_cuda_bindings_everywhere_with_the_cuda13_pin():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    bindings = [r for r in extras["cuda13"] if _name(r) == "cuda-bindings"]
    assert extras["cuda13-bindings"] == bindings


def _make_n_setup(tmp_path, *variables: str) -> list[str]:
    """The pip commands `make -n setup` prints (nothing runs) for a venv that does not exist yet."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        import pytest
        pytest.skip("no `make` here")
    import os

    # the Makefile's defaults, not what the caller exported (CI exports TORCH_SPEC, VISION_SPEC)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_SPEC", "VISION_SPEC", "TORCH_INDEX", "CUDA_MAJOR", "MAKEFLAGS")}
    out = subprocess.run(["make", "-n", "-s", "setup", f"VENV={tmp_path / 'venv'}", *variables],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return [ln.split("pip install -q", 1)[1].split() for ln in out.splitlines()
            if "pip install -q" in ln and "--upgrade pip" not in ln]


def test_torch_and_torchvision_come_in_one_pip_command(tmp_path):
    torch, package = _make_n_setup(tmp_path, "CUDA_MAJOR=")
    assert torch == ['"torch>=2.4"', '"torchvision"']  # pip picks the torchvision of that torch
    assert package == ['-e', '".[test,browser,state16,cuda13-bindings,vision,models]"']


def test_torch_index_is_used_for_torch_and_torchvision_only(tmp_path):
    cpu = "https://download.pytorch.org/whl/cpu"
    torch, package = _make_n_setup(tmp_path, f"TORCH_INDEX={cpu}", "TORCH_SPEC=torch==2.13.0",
                                   "VISION_SPEC=torchvision==0.28.0")
    assert torch == ["--index-url", f'"{cpu}"', '"torch==2.13.0"', '"torchvision==0.28.0"']
    assert "--index-url" not in package


def test_ci_installs_what_a_cuda13_machine_does(tmp_path):
    torch, package = _make_n_setup(tmp_path, "CUDA_MAJOR=13", "VISION_SPEC=")
    assert torch == ['"torch>=2.4"']  # no torchvision asked for: none installed
    assert package == ['-e', '".[test,browser,state16,cuda13]"']
    assert "make test CUDA_MAJOR=13" in (ROOT / ".ci" / "run").read_text()


def test_test_gpu_without_a_gpu_fails_saying_why():
    import shutil
    import subprocess
    import sys

    import pytest
    import torch

    if shutil.which("make") is None:
        pytest.skip("no `make` here")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: `make test-gpu` runs the GPU tests")
    venv = pathlib.Path(sys.prefix)  # this venv, taken as set up (-o: not remade)
    result = subprocess.run(["make", "test-gpu", f"VENV={venv}", "-o", f"{venv}/.fp16lab-installed",
                             "-o", f"{venv}/.fp16lab-wanted"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "sees no CUDA GPU here" in result.stderr and "no GPU test could run" in result.stderr
    assert "pytest" not in result.stdout  # it stopped before running pytest -m gpu


def test_every_notebook_cell_has_an_id():
    # nbformat warns about cells without ids (a future nbformat refuses them)
    import json

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]
        assert None not in ids and len(set(ids)) == len(ids), path.name
