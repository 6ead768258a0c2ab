# `make all` runs the whole chain on the embedded default (configs/default.yaml: photo patches, MobileNetV3-Small)
# into runs/default; each stage is a real file target, so only stale stages re-run. `make test` installs everything itself and runs the test suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN    ?= runs/default
CONFIG ?= configs/default.yaml
STAMP  := $(VENV)/.installed

PRETRAIN_SRC := stages/pretrain.py train/runspec.py train/training.py train/recipes.py core/views.py train/augment.py \
                train/device_augment.py train/preprocess.py train/data.py train/backbones.py train/optim.py \
                train/distributed.py train/configs.py train/heads.py train/method_spec.py train/data_spec.py \
                core/provenance.py $(wildcard train/methods/*.py)
EVAL_SRC     := stages/linear_eval.py train/probe.py train/runspec.py core/provenance.py train/knn.py train/features.py train/verdict.py
EXPORT_SRC   := stages/export.py export/encoder.py export/formats.py export/compression.py export/coreml.py export/onnx_format.py \
                export/metadata.py core/quiet.py export/traced.py export/configs.py export/targets.py core/provenance.py \
                train/backbones.py
VALIDATE_SRC := stages/validate.py train/runspec.py export/formats.py export/compression.py export/coreml.py export/onnx_format.py export/mil_eval.py \
                export/nn_eval.py export/parity.py train/probe.py core/coreml_runtime.py export/configs.py core/provenance.py
REPORT_SRC   := stages/report.py stages/report_figures.py train/runspec.py train/verdict.py core/provenance.py

# the toolchain's usual place, for a shell that starts without /opt/swift on PATH
SWIFT ?= $(shell command -v swift || echo /opt/swift/usr/bin/swift)

.PHONY: all install test test-portable clean-run swift-fixtures swift-build browser mutation
# It ends with the tables, the report, where the model is and the one step that puts it in the iPad demo.
IPAD_APP := swift_demo/EmbeddingDemoApp.swiftpm
# The stages run by a second make with two jobs: strip and trace go beside linear-eval, whose probes fit on one
# core (train/probe.py), and nothing else changes order. Without --output-sync: it would hold pretraining's
# progress bar until the stage ends.
all:
	@$(MAKE) --no-print-directory -j2 $(RUN)/report.html
	@$(BIN)/pipeline show --run $(RUN)
	@echo "model: $(RUN)/export/encoder.mlmodel (one file; beside it encoder.mlpackage, encoder.onnx, encoder.json)"
	@echo "next: open $(IPAD_APP) in Xcode or Swift Playgrounds, run it and import $(RUN)/export/encoder.mlmodel (docs/ipad-demo.md)"

# The project into the venv, editable, with the extras named: by uv (from PyPI, put in the venv by its own pip), which
# fetches and unpacks the wheels in parallel where pip takes one at a time (PyTorch's Linux wheel brings ~3 GB of CUDA
# libraries: 41 s to 1 min 24 s against pip's 3 min 39 s here, README); --compile-bytecode because an interpreter run with
# PYTHONDONTWRITEBYTECODE would otherwise compile torch anew at every import. pip does the same install where uv cannot.
INSTALL = $(BIN)/python -m pip install -q 'uv>=0.9,<1' && $(BIN)/uv pip install --python $(BIN)/python -q \
          --compile-bytecode -e '.[$(1)]' || { echo "note: uv could not install; pip installs instead"; \
          $(BIN)/python -m pip install -q -e '.[$(1)]' 2>&1 | grep -v "^WARNING: Location" || true; }

install: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(call INSTALL,test)
	$(BIN)/python -c "import torch, torchvision, coremltools, onnx, onnxruntime, click" 2>/dev/null
	touch $@

# pretrain -> linear-eval -> strip -> trace -> export -> validate, each reading the files the one before wrote.
# Pretraining re-runs only when its config or code changed: the old run is then deleted (--overwrite), never mixed
# with the new one. Precious: a Ctrl-C leaves last.pt at the step reached (make would delete a half-made target),
# for `pipeline pretrain --resume --out $(RUN)` to go on from.
.PRECIOUS: $(RUN)/checkpoints/last.pt
$(RUN)/checkpoints/last.pt: $(STAMP) $(CONFIG) $(PRETRAIN_SRC)
	$(BIN)/pipeline pretrain --config $(CONFIG) --out $(RUN) --overwrite

$(RUN)/eval/linear.json: $(RUN)/checkpoints/last.pt $(EVAL_SRC)
	$(BIN)/pipeline linear-eval --run $(RUN) --labels-per-class 5

$(RUN)/export/encoder.pt: $(RUN)/checkpoints/last.pt stages/strip.py train/runspec.py core/provenance.py export/encoder.py
	$(BIN)/pipeline strip --run $(RUN)

$(RUN)/export/trace.json: $(RUN)/export/encoder.pt stages/trace.py core/provenance.py export/traced.py
	$(BIN)/pipeline trace --run $(RUN)

# linear.json is a prerequisite so its top-1 lands in every artifact's metadata
$(RUN)/export/encoder.json: $(RUN)/export/trace.json $(RUN)/eval/linear.json $(EXPORT_SRC)
	$(BIN)/pipeline export --run $(RUN) --to all

$(RUN)/validate/parity.json: $(RUN)/export/encoder.json $(VALIDATE_SRC)
	$(BIN)/pipeline validate --run $(RUN)

# the page of every file above: made last, so it shows the whole run
$(RUN)/report.html: $(RUN)/validate/parity.json $(RUN)/eval/linear.json $(REPORT_SRC)
	$(BIN)/pipeline report --run $(RUN)

# pytest (a real headless Chromium among them), then `swift test` of the Swift package (EmbeddingKit against the
# committed fixtures; no torch needed there). worksteal: a worker that runs out of tests takes the other's queued
# ones, where the default handed each its share up front and left one idle for the last minute (docs/tests.md).
# The venv, Chromium and the Swift package's build are made side by side first: the installs wait mostly on the
# network and the disk, the Swift compiler on the CPU (here `swift build --build-tests` took 18 s, Chromium's
# install 23 s).
PYTEST = $(BIN)/python -m pytest -n 2 --dist worksteal
test:
	@$(MAKE) --no-print-directory -j3 $(STAMP) browser swift-build
	$(PYTEST) tests
	cd swift_demo && $(SWIFT) test

swift-build:
	cd swift_demo && $(SWIFT) build --build-tests -q

# The suite under each of ATen's lower CPU kernel paths (the best path is `make test`'s): a number a test pins must
# come out the same on every CPU, and these are the paths other CPUs take. Python tests only; ~2 x make test.
test-portable: $(STAMP) browser
	ATEN_CPU_CAPABILITY=default $(PYTEST) tests
	ATEN_CPU_CAPABILITY=avx2 $(PYTEST) tests

# golden files for swift_demo/ from the run's export/encoder.pt (commit them; a pytest checks they are current)
swift-fixtures: $(RUN)/export/encoder.json
	$(BIN)/pipeline swift-fixtures --run $(RUN)
	sh swift_demo/sync_app.sh

# Debian's headless Chromium and its driver, for the report's and the job service's browser tests; installed only
# when missing, and only as root (elsewhere those tests skip and say why; never a browser a test tool downloads).
browser:
	@if command -v chromedriver >/dev/null && { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "note: chromium/chromedriver missing and not root: the report's browser test will be skipped"; fi

# Mutation testing of the critical modules (docs/tests.md), not part of `make test`: mutmut mutates one function at a
# time and runs the tests that reach it. Narrow it with e.g. `make mutation MUTANTS='train.knn.*'`.
# augment / device_augment: the parameter draws and the view ops only (docs/tests.md says why).
MUTANTS ?= train.knn.x_[kwt]* train.knn.x_majority* export.parity.* stages.validate.x_gate* export.configs.xǁValidateConfigǁgates* stages.validate.x_check__* stages.linear_eval.x_probes* \
           train.methods.* train.heads.* export.encoder.* train.runspec.x_validate* train.runspec.x_config_for_run* \
           train.runspec.x_resolve* core.config.* train.augment.x_sample_* train.augment.x_draw_views* \
           train.device_augment.x_rows_of* train.augment.x_apply_view* \
           train.augment.x_uint8_view* train.augment.x_recipes_for* core.views.x_blur_kernel_size* \
           train.augment.x_view_seed* train.augment.x_epoch_batches* train.augment.x_normalize* \
           train.augment.x_center_views* train.device_augment.x_normalize* train.device_augment.x__plan* \
           train.device_augment.x_apply_views* train.device_augment.x_resize_matrices* \
           train.device_augment.x_blur_matrices* train.device_augment.x_shift_hue* train.device_augment.x__grey* \
           train.device_augment.x_colour* train.device_augment.x_batch_seed* train.device_augment.x_draw_params* \
           $(HELDOUT_MUTANTS)
# what reads val images and what must never learn from them (tests/stages/test_heldout.py): the probes, C's selection,
# the few-label draws, the features' extraction, the monitor, the report's retrieval and maps, validate's images
HELDOUT_MUTANTS ?= train.probe.x_fit_probe* train.probe.x_choose_c* stages.linear_eval.x_linear_probe* \
           train.probe.x_selection_splits* train.probe.x_holdout_split* stages.linear_eval.x__both* \
           stages.linear_eval.x_few_label_probes* stages.linear_eval.x_per_class_subset* \
           stages.linear_eval.x_cached_features* train.knn.x_make_monitor* stages.report.x_retrieval* \
           stages.report.x_cosine_neighbours* stages.report.x_embedding_map* stages.report.x_labels_of* \
           stages.validate.x_val_images* stages.validate.x_train_images* stages.validate.x_spread* \
           stages.pretrain.x_train_split*
# a variable: written in $(call ...) the comma would split the argument (and a comment on its line would leave
# trailing spaces in the value)
MUTATION_EXTRAS := test,mutation
mutation: $(STAMP)
	$(call INSTALL,$(MUTATION_EXTRAS))
	$(BIN)/mutmut run $(foreach m,$(MUTANTS),'$(m)')
	$(BIN)/python benchmarks/mutation_scores.py --survivors

clean-run:
	rm -rf $(RUN)
