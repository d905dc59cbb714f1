# SPDX-License-Identifier: Apache-2.0
# The front door: `make` builds, `make test` runs every test, `make bench` runs the main job.
# Each first installs whatever is missing (deps/), idempotently.
BUILD ?= build
MESON ?= meson
BENCH_ARGS ?=
VENV ?= .venv
PYBUILD ?= build-py
VENV_STAMP := $(VENV)/.ckptio-installed
# DeepSpeed's ops (FastPersist's async_io, which the bench compares with) are compiled on first
# use into this folder: one per .venv, so that two checkouts never share (and overwrite, or
# lock) each other's builds.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

.PHONY: all build deps venv test test-c test-install test-mpi test-python test-sanitize test-gpu bench clean

all: build venv

deps:
	@./deps/install.sh

$(BUILD)/build.ninja: | deps
	$(MESON) setup $(BUILD) >/dev/null

build: deps $(BUILD)/build.ninja
	@$(MESON) compile -C $(BUILD) >/dev/null || $(MESON) compile -C $(BUILD)

# .venv/: the packages of deps/requirements.txt and ckptio itself, installed editable (its C
# extension is rebuilt in $(PYBUILD)/ on import whenever a C source changed), and the ckptio
# command: an editable install leaves it out of .venv/bin, so a link there names the one that
# every `make` rebuilds in $(BUILD)/.
venv: build $(VENV_STAMP)
	@ln -sfn $(abspath $(BUILD))/tools/ckptio $(VENV)/bin/ckptio

$(VENV_STAMP): deps/requirements.txt pyproject.toml python/meson.build | deps
	@[ -x $(VENV)/bin/python ] || python3 -m venv $(VENV)
	@$(VENV)/bin/pip install -q -r deps/requirements.txt >$(VENV)/pip.log 2>&1 \
		|| { cat $(VENV)/pip.log; exit 1; }
	@$(VENV)/bin/pip install -q --no-build-isolation -e . --config-settings=build-dir=$(PYBUILD) \
		>>$(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@touch $@

# The crash and fault tests run a second time with every save compressed (CKPTIO_COMPRESS).
test-c: build
	$(BUILD)/tests/ckptio-tests
	CKPTIO_COMPRESS=all $(BUILD)/tests/ckptio-tests powerloss faults commit/

test-install: build
	./tests/install-check.sh $(BUILD)

# The MPI communicator under mpirun (tests/mpi-check.sh); one line saying so when MPI is not built.
test-mpi: build
	./tests/mpi-check.sh $(BUILD)

# The C suite under ASan+UBSan and under TSan, each in its own build directory.
# The two suites run side by side (each runs its tests one at a time, and most of a test's time
# is spent waiting on I/O, sleeps and servers), each into its log, shown whole afterwards.
test-sanitize: deps
	@[ -f $(BUILD)-asan/build.ninja ] || $(MESON) setup $(BUILD)-asan -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
	@$(MESON) compile -C $(BUILD)-asan >/dev/null
	@[ -f $(BUILD)-tsan/build.ninja ] || $(MESON) setup $(BUILD)-tsan -Db_sanitize=thread -Db_lundef=false >/dev/null
	@$(MESON) compile -C $(BUILD)-tsan >/dev/null
	@UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 $(BUILD)-asan/tests/ckptio-tests >$(BUILD)-asan/tests.log 2>&1 & asan=$$!; \
	TSAN_OPTIONS=halt_on_error=1 $(BUILD)-tsan/tests/ckptio-tests >$(BUILD)-tsan/tests.log 2>&1; tsan=$$?; \
	wait $$asan; asan=$$?; \
	echo "== C tests under ASan+UBSan ($(BUILD)-asan/tests.log)"; cat $(BUILD)-asan/tests.log; \
	echo "== C tests under TSan ($(BUILD)-tsan/tests.log)"; cat $(BUILD)-tsan/tests.log; \
	test $$asan = 0 && test $$tsan = 0

# Bounded libFuzzer runs under ASan+UBSan, the library itself instrumented for coverage: the
# manifest decoder, the partial-manifest merge, the safetensors header parser, the block codecs
# and the peer tier's wire (both ends of a connection over a socketpair), one after another,
# each for an equal share of FUZZ_SECONDS (default 60).
# New inputs go to $(BUILD)-fuzz/corpus-new/<target>, never into the stored corpora; a crash
# leaves its reproducer in $(BUILD)-fuzz/ and fails the target. A 64 KiB input must never need
# more than 256 MiB (-malloc_limit_mb).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := manifest merge safetensors codec peer conf
.PHONY: fuzz
fuzz: deps
	@[ -f $(BUILD)-fuzz/build.ninja ] || CC=clang $(MESON) setup $(BUILD)-fuzz -Dfuzzers=true \
		-Db_sanitize=address,undefined -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link >/dev/null
	@$(MESON) compile -C $(BUILD)-fuzz $(addprefix fuzz/fuzz-,$(FUZZ_TARGETS)) >/dev/null
	@k=$(words $(FUZZ_TARGETS)); half=$$(( ($(FUZZ_SECONDS) + k - 1) / k )); \
	for t in $(FUZZ_TARGETS); do \
		mkdir -p $(BUILD)-fuzz/corpus-new/$$t; echo "fuzz-$$t: $$half s"; \
		( cd $(BUILD)-fuzz && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ./fuzz/fuzz-$$t -max_total_time=$$half -max_len=65536 \
			-malloc_limit_mb=256 -rss_limit_mb=2048 -print_final_stats=1 \
			corpus-new/$$t $(CURDIR)/fuzz/corpus/$$t >fuzz-$$t.log 2>&1 ); rc=$$?; \
		if [ $$rc = 0 ]; then grep -E '^(Done|stat::number_of_executed_units)' $(BUILD)-fuzz/fuzz-$$t.log; \
		else tail -40 $(BUILD)-fuzz/fuzz-$$t.log; exit $$rc; fi; \
	done

test-python: venv
	$(VENV)/bin/python -m pytest -q tests/python bench/test_compress_cell.py bench/test_s3_cell.py bench/test_s3_ranks.py bench/test_s3_requests.py bench/test_fastpersist_cell.py bench/test_tier_cell.py bench/test_plugins_cell.py bench/test_ab.py

# On a machine with an NVIDIA GPU: build with what is there (no installs), run the GPU tests
# against the real driver and the GPU bench, write one JSON summary (tests/gpu/run.sh). Says
# "no GPU" and succeeds where there is none.
test-gpu:
	./tests/gpu/run.sh

# C tests, then the install check and MPI, then pytest (in this order, also under make -j).
test: test-c test-install test-mpi
	@$(MAKE) --no-print-directory test-python

# The seed micro-benchmarks (bench/README.md): ckptio vs torch.save, np.save, safetensors and
# Orbax, with the raw device figures of the same run (`ckptio bench --raw-only`).
bench: build venv
	$(VENV)/bin/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(BUILD) $(PYBUILD) $(VENV_STAMP)
