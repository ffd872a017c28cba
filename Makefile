# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nala-installed
# The torch/torchvision pair this project is tested with (on x86_64 Python 3.11 pip finds them on disk).
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1

.PHONY: install browser demo app test lint bench weights-sr clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PINS) setuptools wheel numpy
	# basicsr 1.4.2's setup.py imports torch: build it against the torch above, not in isolation.
	$(BIN)/pip install -q --no-build-isolation basicsr==1.4.2
	$(BIN)/pip install -q -e '.[sr,diffusion,plot,app,test]'
	touch $@

demo: $(STAMP)
	$(BIN)/python -m nala_gen.sr.demo --out outputs/demo

# The browser tests drive Debian's chromium through playwright (never `playwright install`: it downloads a
# browser). Installed when missing and we are root (CI is); otherwise those tests skip and say why.
browser:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)

app: $(STAMP)
	$(BIN)/nala-app --host 127.0.0.1 --port 7860

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/nala-bench attention
	$(BIN)/nala-bench entropy
	$(BIN)/nala-bench sr

# The shipped SR weights: three CPU trainings on the embedded set (resumable), then export and evaluation.
SR_RUNS := NaLaSR/train_NaLaSR_light_x4_mini ESRT/train_ESRT_x4_mini NaLaSR/train_NaLaSR_light_x2_mini
weights-sr: $(STAMP)
	test -d datasets/mini || $(BIN)/nala-sr prepare mini
	for run in $(SR_RUNS); do $(BIN)/python -m nala_gen.sr.train -opt options/train/$$run.yml --auto_resume || exit 1; done
	PATH=$(BIN):$$PATH $(BIN)/python scripts/ship_sr_weights.py

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache *.egg-info
