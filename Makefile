# `make all` runs the whole chain on the embedded default into runs/default; each stage is a real file target,
# so only stale stages re-run. `make test` installs everything itself and runs the test suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN    ?= runs/default
CONFIG ?= configs/default.yaml
STAMP  := $(VENV)/.installed

PRETRAIN_SRC := stages/pretrain.py stages/augment.py stages/data.py stages/backbones.py stages/optim.py $(wildcard stages/methods/*.py)

.PHONY: all install test clean-run
all: $(RUN)/checkpoints/last.pt

install: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -c "import torch, torchvision, coremltools, onnx, onnxruntime, click" 2>/dev/null
	touch $@

$(RUN)/checkpoints/last.pt: $(STAMP) $(CONFIG) $(PRETRAIN_SRC)
	$(BIN)/pipeline pretrain --config $(CONFIG) --out $(RUN)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests

clean-run:
	rm -rf $(RUN)
