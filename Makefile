# fp16lab: two commands.
#   make lab   set up .venv and open JupyterLab on notebooks/
#   make test  set up .venv and run every test, notebook execution included
#
# TORCH_SPEC picks the torch wheel (CI pins the CPU build; a GPU machine keeps the default).
# CuPy is added as an extra when nvidia-smi reports a driver: cupy-cuda13x for CUDA 13,
# cupy-cuda12x for CUDA 12, nothing without a GPU. The set-up runs again when pyproject.toml,
# TORCH_SPEC or the extras change (they are written into $(VENV)/.fp16lab-wanted).
#
#   make benchmarks             every benchmark; results to data/local/ (git-ignored)
#   make benchmarks REPLACE=1   the same, overwriting the committed files in data/

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch>=2.4
PYTEST_ARGS ?=
REPLACE    ?=
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.fp16lab-installed
WANTED     := $(VENV)/.fp16lab-wanted

comma      := ,
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
GPU_EXTRAS := $(if $(filter 13 14,$(CUDA_MAJOR)),$(comma)cuda13$(comma)vision,$(if $(filter 12,$(CUDA_MAJOR)),$(comma)cuda12$(comma)vision,))
EXTRAS     := test,browser$(GPU_EXTRAS)

.PHONY: setup lab test test-gpu benchmarks clean info mutation FORCE

setup: $(STAMP)

# What the installation should be; rewritten (so newer than the stamp) only when it changes.
$(WANTED): FORCE
	@mkdir -p $(VENV)
	@echo '$(TORCH_SPEC) [$(EXTRAS)]' | cmp -s - $@ || echo '$(TORCH_SPEC) [$(EXTRAS)]' > $@

$(STAMP): pyproject.toml $(WANTED)
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

# Mutation testing (mutmut, one worker, CPU) over the core modules: plants small bugs and
# checks that the tests notice. Not part of `make test`; run it before calling a numerics change
# done. MODULES picks some (make mutation MODULES="bits scaling"); the report, with the
# survivors, goes to data/mutation_report.md.
MODULES ?=
mutation: setup
	$(PY) -m pip install -q -e ".[mutation]"
	$(PY) -m fp16lab.testing.mutation $(MODULES)

# Only the GPU-marked tests (on a machine with a CUDA GPU).
test-gpu: setup
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

# Every benchmark of fp16lab.bench on the local GPU; each writes its results, with provenance,
# to data/local/ (the notebooks then show yours), or over the committed data/ with REPLACE=1.
benchmarks: setup
	@gpus=$$($(PY) -c 'import torch; print(torch.cuda.device_count())'); \
	for b in $$($(PY) -c 'from fp16lab.bench import BENCHMARKS; print(*BENCHMARKS)'); do \
	  if [ $$b = distributed ] && [ $$gpus -lt 2 ]; then echo "--- fp16lab bench distributed: skipped, it needs 2 GPUs ($$gpus here)"; continue; fi; \
	  echo "--- fp16lab bench $$b"; $(VENV)/bin/fp16lab bench $$b $(if $(REPLACE),--replace) || exit $$?; done

info: setup
	$(VENV)/bin/fp16lab info

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
