# Two commands do all the set-up on a fresh machine (Python 3.10+ and pip):
#   make demo   creates .venv, installs shardstream, packs a sample image folder and a
#               Parquet table, prints info, verifies and reads samples back
#   make test   creates .venv, installs with the test extras, runs ruff, builds the docs site
#               strictly (mkdocs build --strict) and runs pytest
#   make docs   serves the documentation site on http://127.0.0.1:8000 (mkdocs serve)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch first, pinned, so pip takes the local CPU wheel and never a CUDA build. Both overridable:
#   make test TORCH="torch==2.5.1"
#   make test TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"   (the CPU build elsewhere)
# (after `make clean`, or the existing .venv is kept as it is)
TORCH       ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: demo test docs docker-test dali-test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH_INDEX) $(TORCH)
	$(BIN)/pip install -q -e ".[wds,fast,s3]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH_INDEX) $(TORCH)
	$(BIN)/pip install -q -e '.[test]'
	# transformers for one test of the token convention, without its dependencies (which would pull another torch)
	$(BIN)/pip install -q --no-deps 'transformers>=4.40'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python examples/make_demo_data.py demo
	$(BIN)/shardstream pack demo/images demo/images-shards --shard-size 100KB --overwrite
	$(BIN)/shardstream info demo/images-shards
	$(BIN)/shardstream ls demo/images-shards
	$(BIN)/shardstream verify demo/images-shards
	$(BIN)/shardstream cat demo/images-shards 0
	$(BIN)/shardstream pack demo/table.parquet demo/table-shards --samples-per-shard 400 --overwrite
	$(BIN)/shardstream info demo/table-shards
	$(BIN)/shardstream cat demo/table-shards 7
	$(BIN)/python examples/read_back.py demo/images-shards demo/table-shards

test: $(VENV)/.installed-test
	$(BIN)/ruff check shardstream tests benchmarks examples docker docs/hooks.py
	$(BIN)/ruff format --check shardstream tests benchmarks examples docker docs/hooks.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# The documentation site (mkdocs.yml, docs/), rebuilt on every change; the packages are the test extras'.
docs: $(VENV)/.installed-test
	$(BIN)/mkdocs serve

# The container tests with a real engine (podman or docker, see docs/guides/containers.md): a base image made
# with mmdebstrap, the wheels, the images, then runs inside them and the compose stack end to end.
#   apt-get install podman runc podman-compose mmdebstrap   (once, as root)
docker-test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m container -rs tests/docker

# NVIDIA DALI's webdataset reader on the CPU (tests/interop/test_dali.py, the dali mark) runs from an
# environment of its own, .venv-dali: about 520 MB of wheels (1.1 GB installed), too large for make test,
# which skips those tests without it. Built once; DALI is overridable, e.g. DALI=nvidia-dali-cuda120==2.4.0
DALI ?= nvidia-dali-cuda120
.venv-dali/.installed:
	$(PYTHON) -m venv .venv-dali
	.venv-dali/bin/pip install -q $(DALI) numpy
	touch $@

dali-test: $(VENV)/.installed-test .venv-dali/.installed
	$(BIN)/python -m pytest -q -m dali -rs tests/interop

clean:
	rm -rf $(VENV) .venv-dali demo site .pytest_cache .ruff_cache
