# fastckpt — everyday commands. Each sets up what it needs in .venv first.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: setup demo demo-s3 test test-quick test-gpu gpu-check test-many test-bits-loaded test-planted bench bench-gpu bench-save-load bench-lightning bench-deepspeed bench-dcp bench-tiers bench-pmem bench-offload reliability reliability-many clean distclean

$(STAMP): setup.py setup.cfg pyproject.toml $(wildcard native/src/*.cc native/include/fastckpt/*.h)
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# the local CPU build of torch first, so nothing below can pull a CUDA torch
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q pybind11 setuptools wheel ninja numpy
	# DeepSpeed after torch, without building its CUDA ops (it then uses its CPU accelerator here);
	# its CPU shared-memory op prebuilt, so no process compiles it at start-up (a process killed
	# mid-build leaves torch's lock file behind and every later DeepSpeed start waits on it forever).
	# Its wheel is built (its two sources side by side by ninja: DS_ENABLE_NINJA) while fastckpt and
	# the rest install; it sees only what is installed above, none of which the rest changes.
	if $(VPY) -c "import importlib.metadata as m, sys; sys.exit(m.version('deepspeed') != '0.19.8')" 2>/dev/null; then \
	  $(VPY) -m pip install -q --no-build-isolation -e ".[dev]"; \
	else \
	  rm -rf $(VENV)/deepspeed-wheel; \
	  PATH="$(abspath $(VENV))/bin:$$PATH" DS_ENABLE_NINJA=1 DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 \
	    $(VPY) -m pip wheel -q --no-cache-dir --no-deps --no-build-isolation -w $(VENV)/deepspeed-wheel \
	    "deepspeed==0.19.8" > $(VENV)/deepspeed-wheel.log 2>&1 & ds=$$!; \
	  $(VPY) -m pip install -q --no-build-isolation -e ".[dev]"; rest=$$?; \
	  wait $$ds || { tail -n 40 $(VENV)/deepspeed-wheel.log; exit 1; }; [ $$rest = 0 ] || exit $$rest; \
	  $(VPY) -m pip install -q $(VENV)/deepspeed-wheel/deepspeed-0.19.8-*.whl; \
	fi
	# torchtitan 0.3.0 from the registry, without the training stack it requires (datasets, tensorboard,
	# wandb, tokenizers, torchdata: a minute of install): what the suite runs of it (its CheckpointManager,
	# optimizers and LR schedulers) imports only tyro and spmd_types, which the dev extra installs
	$(VPY) -m pip install -q --no-deps torchtitan==0.3.0
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VPY) -m fastckpt.demo $(ARGS)

# the demo against a local S3 server (SeaweedFS, started and stopped here): checkpoints in s3://ckpt/demo
demo-s3: $(STAMP)
	$(VPY) tests/support/s3_server.py -- $(VPY) -m fastckpt.demo root=s3://ckpt/demo $(ARGS)

# every test, TEST_JOBS pytest-xdist workers at once (auto: one per core), the 15 slowest named
TEST_JOBS ?= auto
test: $(STAMP)
	$(VPY) -m pytest -q tests -n $(TEST_JOBS) --durations=15 $(ARGS)

# the edit loop: everything but the slow tier (tests/conftest.py's SLOW: ranks, frameworks, kill
# campaigns, whole programs), a few minutes
test-quick: $(STAMP)
	$(VPY) -m pytest -q tests -n $(TEST_JOBS) -m "not slow" --durations=10 $(ARGS)

# every `gpu` test alone in its own process under a hard timeout: one PASS/FAIL/HANG/SKIP line each,
# non-zero exit on any FAIL or HANG (3 when all skipped: no CUDA here). On a GPU machine it runs with
# that machine's python3 (its CUDA torch), after `source .whl/gpu-env.sh`; no .venv is made.
PYGPU   ?= python3
JOBS    ?= 4
GPU_LOG ?= $(or $(OUT),.)/gpu-tests.log
test-gpu:
	$(PYGPU) tests/support/run_isolated.py --timeout 300 --jobs $(JOBS) --log $(GPU_LOG) -- tests -m gpu $(ARGS)

# what a lent GPU runs first, in one device call of at most ~9 minutes: every gpu test (as test-gpu)
# and a short benchmarks/gpu_overhead.py, logs and JSON under $(OUT) (tests/support/gpu_check.sh says
# what each part is); GPU_CHECK=long for the second call (the full-size benchmark)
gpu-check:
	PYGPU=$(PYGPU) bash tests/support/gpu_check.sh

test-many: $(STAMP)
	$(VPY) -m pytest -q tests/fastckpt/test_crash.py tests/fastckpt/pmem/test_pmem.py -k "kill9" --many

# every bug of tests/planted/bugs.py planted into a scratch copy, one at a time: its tests must
# catch it (the slow tier: about 10 minutes, a native rebuild included)
test-planted: $(STAMP)
	$(VPY) tests/planted/run.py $(ARGS)

# the tests that compare bits across runs (training with and without offload, resumed and
# uninterrupted runs, activations as autograd saved them), TIMES runs beside two busy loops:
# a result that depends on scheduling or on a BLAS code path shows here
BITS_FILES := tests/deepspeed_fastckpt/test_deepspeed.py tests/fastckpt/offload/test_offload_activations.py \
              tests/fastckpt/offload/test_offload_layout.py tests/lightning_fastckpt/test_lightning_io.py \
              tests/lightning_fastckpt/test_lightning_ddp.py tests/fastckpt/test_reproducibility.py \
              tests/fastckpt/dcp/test_fsdp2.py tests/torchtitan_fastckpt/test_torchtitan.py
BITS_K  := bit or equal or exact or layout or as_it_was or same_weights
TIMES   ?= 3
test-bits-loaded: $(STAMP)
	$(VPY) tests/support/under_load.py --times $(TIMES) --busy 2 --grep "passed|failed|error" -- \
	  $(VPY) -m pytest -q -p no:cacheprovider $(BITS_FILES) -k "$(BITS_K)"

# every benchmark (each records its section of benchmarks/RESULTS.md; JSON and plot in benchmarks/out/)
bench: $(STAMP)
	$(VPY) benchmarks/save_load.py
	$(VPY) benchmarks/lightning_overhead.py
	$(VPY) benchmarks/deepspeed_overhead.py
	$(VPY) benchmarks/dcp.py
	$(VPY) benchmarks/pmem_store.py
	$(VPY) benchmarks/offload.py
	$(VPY) benchmarks/tuned_interval.py
	$(VPY) benchmarks/layerwise_ddp.py
	$(VPY) benchmarks/goodput.py
	$(VPY) benchmarks/tiers.py
	$(VPY) benchmarks/reliability.py --many

bench-save-load: $(STAMP)
	$(VPY) benchmarks/save_load.py $(ARGS)

bench-lightning: $(STAMP)
	$(VPY) benchmarks/lightning_overhead.py $(ARGS)

bench-deepspeed: $(STAMP)
	$(VPY) benchmarks/deepspeed_overhead.py $(ARGS)

# PyTorch DCP under FSDP2 (2 gloo ranks): DCP's save / async_save vs FastStorageWriter + FastStager
bench-dcp: $(STAMP)
	$(VPY) benchmarks/dcp.py $(ARGS)

# every checkpointer of the plain loop, Lightning and DeepSpeed in one run on one GPU (after
# `source .whl/gpu-env.sh` there, with that machine's python3); on CPU it runs with a small model
bench-gpu:
	$(PYGPU) benchmarks/gpu_overhead.py $(ARGS)

bench-tiers: $(STAMP)
	$(VPY) benchmarks/tiers.py $(ARGS)

bench-pmem: $(STAMP)
	$(VPY) benchmarks/pmem_store.py $(ARGS)

bench-offload: $(STAMP)
	$(VPY) benchmarks/offload.py $(ARGS)

# the built extension and its install stamp go together: the next command rebuilds both
# (the venv and its packages stay; `make distclean` removes it too)
clean:
	rm -rf build *.egg-info fastckpt/*.so .pytest_cache $(STAMP)

distclean: clean
	rm -rf $(VENV)

reliability: $(STAMP)
	$(VPY) benchmarks/reliability.py $(ARGS)

reliability-many: $(STAMP)
	$(VPY) benchmarks/reliability.py --many $(ARGS)
