# fp16lab: two commands.
#   make lab   set up .venv and open JupyterLab on notebooks/
#   make test  set up .venv and run every test, notebook execution included
#
# TORCH_SPEC picks the torch wheel (CI pins the CPU build; a GPU machine keeps the default).
# CuPy is added as an extra when nvidia-smi reports a driver: cupy-cuda13x for CUDA 13,
# cupy-cuda12x for CUDA 12, nothing without a GPU.

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch>=2.4
PYTEST_ARGS ?=
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.fp16lab-installed

comma      := ,
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
GPU_EXTRAS := $(if $(filter 13 14,$(CUDA_MAJOR)),$(comma)cuda13$(comma)vision,$(if $(filter 12,$(CUDA_MAJOR)),$(comma)cuda12$(comma)vision,))
EXTRAS     := test,browser$(GPU_EXTRAS)

.PHONY: setup lab test test-gpu benchmarks clean info

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@echo "fp16lab installed in $(VENV) with extras [$(EXTRAS)]"
	@touch $@

# JupyterLab's defaults for this venv (lab-settings/overrides.json): no news or update
# pop-ups, and widget state saved with the notebook, so a reopened notebook draws its widgets
# instead of "Error displaying widget: model not found". Root (containers, cloud GPU boxes)
# needs --allow-root.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
USER_ID    ?= $(shell id -u)
LAB_FLAGS  := --notebook-dir=notebooks --LabApp.news_url= \
              --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
              $(if $(filter 0,$(USER_ID)),--allow-root)

$(LAB_OVERRIDES): lab-settings/overrides.json | $(STAMP)
	mkdir -p $(@D)
	cp $< $@

lab: setup $(LAB_OVERRIDES)
	$(VENV)/bin/jupyter lab $(LAB_FLAGS)

test: setup
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure"; fi; exit $$rc

# Only the GPU-marked tests (on a machine with a CUDA GPU).
test-gpu: setup
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

# Every benchmark on the local GPU; each writes its results, with provenance, under data/.
benchmarks: setup
	@for b in census gemm gemm_ceiling alignment diagnostics_overhead sweep_engine_vs_loop sweep_reference; do \
	  echo "--- benchmarks/$$b.py"; $(PY) benchmarks/$$b.py || exit $$?; done
	$(VENV)/bin/fp16lab claims --out data/

info: setup
	$(VENV)/bin/fp16lab info

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
