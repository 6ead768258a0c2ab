# `make all` runs the whole chain on the embedded default into runs/default; each stage is a real file target, so
# only stale stages re-run. `make test` installs everything itself and runs the test suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN    ?= runs/default
CONFIG ?= configs/default.yaml
STAMP  := $(VENV)/.installed

PRETRAIN_SRC := stages/pretrain.py stages/augment.py stages/device_augment.py stages/data.py stages/backbones.py \
                stages/optim.py stages/distributed.py $(wildcard stages/methods/*.py)
EVAL_SRC     := stages/linear_eval.py stages/knn.py stages/features.py
EXPORT_SRC   := stages/convert.py export/encoder.py export/formats.py export/coreml.py export/onnx_format.py \
                export/metadata.py
VALIDATE_SRC := stages/validate.py export/mil_eval.py export/nn_eval.py export/parity.py export/coreml_runtime.py

.PHONY: all install test clean-run mutation
all: $(RUN)/validate/parity.json
	@$(BIN)/pipeline show --run $(RUN)

install: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/python -c "import torch, torchvision, coremltools, onnx, onnxruntime, click" 2>/dev/null
	touch $@

# pretrain -> linear-eval -> strip -> trace -> export -> validate, each reading the files the one before wrote
$(RUN)/checkpoints/last.pt: $(STAMP) $(CONFIG) $(PRETRAIN_SRC)
	$(BIN)/pipeline pretrain --config $(CONFIG) --out $(RUN)

$(RUN)/eval/linear.json: $(RUN)/checkpoints/last.pt $(EVAL_SRC)
	$(BIN)/pipeline linear-eval --run $(RUN)

$(RUN)/export/encoder.pt: $(RUN)/checkpoints/last.pt stages/strip.py export/encoder.py
	$(BIN)/pipeline strip --run $(RUN)

$(RUN)/export/trace.json: $(RUN)/export/encoder.pt stages/trace.py
	$(BIN)/pipeline trace --run $(RUN)

# linear.json is a prerequisite so its top-1 lands in every artifact's metadata
$(RUN)/export/encoder.json: $(RUN)/export/trace.json $(RUN)/eval/linear.json $(EXPORT_SRC)
	$(BIN)/pipeline export --run $(RUN) --to all

$(RUN)/validate/parity.json: $(RUN)/export/encoder.json $(VALIDATE_SRC)
	$(BIN)/pipeline validate --run $(RUN)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests

# Mutation testing of the critical modules (README "Tests"), not part of `make test`: mutmut mutates one function at a
# time and runs the tests that reach it. Narrow it with e.g. `make mutation MUTANTS='stages.knn.*'`.
MUTANTS ?= stages.knn.x_[kwt]* stages.knn.x_majority* export.parity.* stages.validate.x_gate* stages.validate.x_check* stages.linear_eval.x_probes* \
           stages.methods.* export.encoder.* stages.pretrain.x_validate* stages.pretrain.x_config_for_run* \
           stages.pretrain.x_resolve* pipeline.config.* stages.augment.* stages.device_augment.*
mutation: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,mutation]' 2>&1 | grep -v "^WARNING: Location" || true
	$(BIN)/mutmut run $(foreach m,$(MUTANTS),'$(m)')
	$(BIN)/python benchmarks/mutation_scores.py --survivors

clean-run:
	rm -rf $(RUN)
