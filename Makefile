# fp16lab: two commands.
#   make lab   set up .venv and open JupyterLab on notebooks/
#   make test  set up .venv and run every test, notebook execution included
#
# TORCH_SPEC picks the torch wheel and VISION_SPEC the torchvision one; both are installed by
# one pip command, so pip picks a torchvision built for that torch (an empty VISION_SPEC
# installs no torchvision). TORCH_INDEX, when set, is the index both come from, e.g. PyTorch's
# CPU wheels: make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu (for a new .venv: pip
# keeps an installed torch that satisfies TORCH_SPEC, so `make clean` first).
# cuda-bindings is installed everywhere (it imports without a GPU): CUDA 13's, or CUDA 12's where
# nvidia-smi reports a CUDA 12 driver. CuPy is added where nvidia-smi reports a driver:
# cupy-cuda13x for CUDA 13, cupy-cuda12x for CUDA 12. CUDA_MAJOR=13 on the command line installs
# what a CUDA 13 machine gets, without one (CI does). The set-up runs again when pyproject.toml,
# TORCH_SPEC, VISION_SPEC or the extras change (they are written into $(VENV)/.fp16lab-wanted).
#
#   make benchmarks             every benchmark; results to data/local/ (git-ignored)
#   make benchmarks REPLACE=1   the same, overwriting the committed files in data/

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch>=2.4
VISION_SPEC ?= torchvision
TORCH_INDEX ?=
PYTEST_ARGS ?=
REPLACE    ?=
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.fp16lab-installed
WANTED     := $(VENV)/.fp16lab-wanted

comma      := ,
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
CUDA_EXTRAS := $(if $(filter 13 14,$(CUDA_MAJOR)),cuda13,$(if $(filter 12,$(CUDA_MAJOR)),cuda12,cuda13-bindings))
EXTRAS     := test,browser,state16,$(CUDA_EXTRAS)$(if $(VISION_SPEC),$(comma)vision$(comma)models)
WANT       := $(TORCH_SPEC) [$(EXTRAS)] $(VISION_SPEC)

.PHONY: setup lab test test-gpu benchmarks clean info mutation mutation-changed FORCE

setup: $(STAMP)

# What the installation should be; rewritten (so newer than the stamp) only when it changes.
$(WANTED): FORCE
	@mkdir -p $(VENV)
	@echo '$(WANT)' | cmp -s - $@ || echo '$(WANT)' > $@

$(STAMP): pyproject.toml $(WANTED)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") "$(TORCH_SPEC)" $(if $(VISION_SPEC),"$(VISION_SPEC)")
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

# Mutation testing (mutmut, one worker, CPU) over every module of the package: plants small bugs
# and checks that the tests notice. Not part of `make test`. Results are cached by the content of
# each module and its tests, so `make mutation` re-runs only what changed, and a stopped run goes
# on where it stopped. MODULES picks some (make mutation MODULES="bits.patterns waves"); the
# report, with the survivors, goes to data/mutation_report.md.
# `make mutation-changed` runs only the modules whose source or tests changed since BASE (default:
# the merge-base with origin/main or main, else HEAD~1): run it before calling a module done.
# How long a module takes, measured on a 2-core machine shared with other work (one worker):
# 0.25 to 0.8 mutants/s, so 3 to 10 minutes a module: waves.py (61 mutants) 254 s,
# scaling/skips.py (86) 330 s, profile/summary.py (144) 190 s, fp8/scales.py (353) 607 s.
# Modules whose tests wait on threads (inputs/producers.py) are slower: a mutant that
# deadlocks waits for its timeout.
MODULES ?=
BASE ?=
mutation: setup
	$(PY) -m pip install -q -e ".[mutation]"
	$(PY) -m fp16lab.testing.mutation $(MODULES)

mutation-changed: setup
	$(PY) -m pip install -q -e ".[mutation]"
	$(PY) -m fp16lab.testing.mutation --changed $(BASE)

# Only the GPU-marked tests (on a machine with a CUDA GPU): where torch sees none, every one of
# them would skip, so this fails instead of "passing" with nothing run.
test-gpu: setup
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
	  "make test-gpu: torch " + torch.__version__ + " sees no CUDA GPU here (torch.cuda.is_available() is False; " \
	  + ("a CPU-only build" if torch.version.cuda is None else "built for CUDA " + torch.version.cuda + ": is a GPU visible, with a new enough driver?") \
	  + "), so no GPU test could run")'
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

# Every benchmark of fp16lab.bench on the local GPU; each writes its results, with provenance,
# to data/local/ (the notebooks then show yours), or over the committed data/ with REPLACE=1.
benchmarks: setup
	@gpus=$$($(PY) -c 'import torch; print(torch.cuda.device_count())'); \
	for b in $$($(PY) -c 'from fp16lab.bench import BENCHMARKS; print(*BENCHMARKS)'); do \
	  if [ $$b = distributed ] && [ $$gpus -lt 2 ]; then echo "--- fp16lab bench distributed: skipped, it needs 2 GPUs ($$gpus here)"; continue; fi; \
	  if [ $$b = counters ] && why=$$($(PY) -c 'import fp16lab.ncu as n; print(n.unavailable() or "")') && [ -n "$$why" ]; then echo "--- fp16lab bench counters: skipped: $$why"; continue; fi; \
	  echo "--- fp16lab bench $$b"; $(VENV)/bin/fp16lab bench $$b $(if $(REPLACE),--replace) || exit $$?; done

info: setup
	$(VENV)/bin/fp16lab info

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
