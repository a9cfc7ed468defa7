# The two commands of the README: `make run` (the default training job) and `make test` (every test).
# Both install what is missing (Debian packages; for tests also a Python virtual environment with PyTorch and
# transformers as the reference), configure and build first.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)

.PHONY: run test build setup asan-test bench clean

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -USNUG_CUDA >/dev/null
	@MAKEFLAGS= cmake --build $(BUILD) -j $(JOBS)

# The default job needs the snug program alone (not the tests, benchmarks or GPU tools), and the CUDA backend only
# where a GPU is visible to run it on: elsewhere the program builds in a third of the time (16 s against 49 s on 2
# cores). `make build` and `make test` build the CUDA backend whenever nvcc is found, as CMake decides by default.
RUN_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo -USNUG_CUDA || echo -DSNUG_CUDA=OFF)
run: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(RUN_CUDA) >/dev/null
	@MAKEFLAGS= cmake --build $(BUILD) -j $(JOBS) --target snug
	./$(BUILD)/snug train

test: build
	@venv=$$(bash scripts/venv.sh) && \
	  cmake -S . -B $(BUILD) -DSNUG_VENV=$$venv >/dev/null && \
	  cd $(BUILD) && ctest --output-on-failure -j 2
	@$(MAKE) --no-print-directory asan-test

# The unit tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
asan-test: setup
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSNUG_SANITIZE=ON >/dev/null
	@MAKEFLAGS= cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 -L "unit|cli"

# Every benchmark, each printing ratios against its peer measured in the same run (results: docs/PERFORMANCE.md).
bench: build
	@venv=$$(bash scripts/venv.sh) && \
	  echo "== training: snug vs PyTorch eager" && $$venv/bin/python bench/bench_train.py --snug $(BUILD)/snug && \
	  echo "== attention: tiled vs naive" && ./$(BUILD)/bench_attention 2 && \
	  echo "== activation levers" && $$venv/bin/python bench/bench_levers.py --snug $(BUILD)/snug && \
	  echo "== tokenizer: snug vs Hugging Face tokenizers" && $$venv/bin/python bench/bench_tokenizer.py && \
	  echo "== packing" && ./$(BUILD)/bench_packing && \
	  echo "== sequence levers" && $$venv/bin/python bench/bench_sequence.py --snug $(BUILD)/snug && \
	  echo "== LoRA and QLoRA: snug vs PEFT" && $$venv/bin/python bench/bench_lora.py --snug $(BUILD)/snug && \
	  $$venv/bin/python bench/bench_lora.py --snug $(BUILD)/snug --qlora

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
