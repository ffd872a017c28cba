# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nala-installed
# The torch/torchvision pair this project is tested with (on x86_64 Python 3.11 pip finds them on disk).
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1

.PHONY: install browser demo app test lint docs bench sr-data weights-sr weights-diffusion clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml Makefile $(wildcard nala_gen/ops/csrc/*)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PINS) setuptools wheel numpy ninja
	# basicsr 1.4.2's setup.py imports torch: build it against the torch above, not in isolation.
	$(BIN)/pip install -q --no-build-isolation basicsr==1.4.2
	# Not isolated either: the fused NaLa op (C++, about a minute to compile) builds against that torch.
	$(BIN)/pip install -q --no-build-isolation -e '.[sr,diffusion,plot,app,video,test,docs]'
	$(BIN)/python -c "from nala_gen.ops import nala_fused as f; print('nala_gen: fused NaLa op:', f.instruction_set() or f.unavailable_reason())"
	$(BIN)/python -c "from nala_gen.ops import winograd as w; print('nala_gen: Winograd convolution:', w.instruction_set() or w.unavailable_reason())"
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

# The docs site (mkdocs-material, API reference from the docstrings): a broken link, anchor or include, a page
# missing from the nav or a docstring mkdocstrings cannot read fails the strict build. Nothing is downloaded.
DOCS_BUILD := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(DOCS_BUILD) -d build/docs-site-test
	$(BIN)/python -m pytest -q

docs: $(STAMP)
	$(DOCS_BUILD) -d site
	@echo "docs: site/index.html (or: $(BIN)/mkdocs serve)"

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The standard SR test sets (Set5, Set14, B100, Urban100: HR pictures, one folder each) and the training photographs;
# on this project's machines in ../shared/datasets, elsewhere a folder of your own download.
BENCHMARK_SETS ?= ../shared/datasets/benchmark
TRAIN_PHOTOS ?= ../shared/datasets/train

sr-data: $(STAMP)
	$(BIN)/nala-sr prepare benchmarks $(BENCHMARK_SETS)  # datasets/Set5 ... datasets/Urban100
	$(BIN)/nala-sr prepare train $(TRAIN_PHOTOS) datasets/train --tests $(BENCHMARK_SETS)  # none a test picture

# Every file under benchmarks/results/ (hours on a 2-core CPU: the SR ablation trains five models). The
# trained-entropy and digits-quality steps read the shipped weights (make weights-sr / weights-diffusion).
# NaLaDiT ships as the pre-block model (it samples better); the block model and its softmax twin are kept
# (*-block); the retired pre-block NaLaSiT's row was measured from weights/nalasit-digits at commit 9e1e4df (nala-gen quality -m that folder).
DIGITS_MODELS := naladit-digits naladit-digits-block nalasit-digits naladit-digits-softmax naladit-digits-softmax-block
bench: $(STAMP)
	$(BIN)/nala-bench attention --backward --repeats 9
	$(BIN)/nala-bench attention --contention --sizes 16384 71680 --methods nala nala_eager relu --repeats 9
	$(BIN)/nala-bench steps
	$(BIN)/nala-bench attention --sizes 62500 --methods nala relu --heads 8 --head-dim 18 --tag d18  # NaLaSR at 1 MP out
	NALA_GEN_FUSED_ISA=avx2 $(BIN)/nala-bench attention --sizes 62500 --methods nala relu --heads 8 --head-dim 18 --tag d18_avx2
	$(BIN)/nala-bench entropy
	$(BIN)/nala-bench sr
	$(BIN)/nala-bench peers --skip esrt:500  # ESRT at 4 MP out: over 20 minutes (quadratic attention)
	$(BIN)/nala-bench peers --models nalasr srvgg --rounds 5 --keep-others  # the pair issue 20 compares, alternated
	$(BIN)/nala-bench winograd  # the Winograd 3x3 convolutions against oneDNN: per shape and per forward
	test -d datasets/Urban100 || $(BIN)/nala-sr prepare benchmarks $(BENCHMARK_SETS)
	$(BIN)/nala-bench sr-sets  # PSNR/SSIM of the shipped weights on Set5, Set14, B100, Urban100 (x2, x4)
	$(BIN)/nala-bench sr-sets-cost --subset Urban100:10  # the paper's Table 20: ESRT takes ~40 s per Urban100 picture
	$(BIN)/nala-bench train-speed --rounds 2  # NaLaSR training steps: samples/s per variant (layout, bf16, compile)
	$(BIN)/nala-bench train-speed --threads 1 --variants baseline channels_last channels_last+bf16 --rounds 2 --tag threads1
	$(BIN)/nala-bench train-speed --variants baseline channels_last channels_last+bf16 --rounds 1 --profile --tag profile
	if $(BIN)/python -c "import nala_gen.devices as d; raise SystemExit(not d.cpu_native_bf16())"; then \
		$(BIN)/nala-bench peers --models nalasr srvgg --precisions fp32 bf16 --sides 250 500 --rounds 3; \
	else echo "bench: this CPU has no native bf16: sr_peers_precision.json and the bf16 quality not remeasured"; fi
	$(BIN)/nala-bench dit-sizes  # one DDPM step, NaLaDiT against its softmax twin, at 32/64/128 px
	$(BIN)/nala-bench upscale --engines torch torch_eager onnxruntime
	$(BIN)/nala-bench upscale-overhead
	$(BIN)/nala-bench upscale-memory
	$(BIN)/nala-bench upscale-folder
	$(BIN)/nala-bench trained-entropy
	test -d datasets/mini || $(BIN)/nala-sr prepare mini
	$(BIN)/nala-bench sr-ablation --iters 1000  # 9 variants x 3 seeds; finished runs (the ledger) are not redone
	$(BIN)/nala-bench dit-ablation --rescore  # the block against the model it replaced, 3 seeds each (hours)
	$(BIN)/nala-bench dit-ablation --steps 3000 --seeds 0 --variants parts  # the block's parts one at a time
	$(BIN)/nala-sr evaluate --data datasets/mini/val --scale 4 --models bicubic esrt-x4 nalasr-light-x4 \
		--json benchmarks/results/sr_quality.json
	$(BIN)/nala-sr evaluate --data datasets/mini/val --scale 2 --models bicubic nalasr-light-x2 \
		--json benchmarks/results/sr_quality.json
	test -d datasets/photos || $(BIN)/nala-sr prepare photos --install
	$(BIN)/nala-sr evaluate --data datasets/photos/val --scale 4 --models bicubic esrt-x4 nalasr-light-x4 \
		--tile auto --memory-budget-mb 4096 --json benchmarks/results/sr_quality_photos.json
	$(BIN)/nala-sr evaluate --data datasets/photos/val --scale 2 --models bicubic nalasr-light-x2 \
		--tile auto --memory-budget-mb 4096 --json benchmarks/results/sr_quality_photos.json
	if $(BIN)/python -c "import nala_gen.devices as d; raise SystemExit(not d.cpu_native_bf16())"; then \
		for s in 4 2; do \
		$(BIN)/nala-sr evaluate --data datasets/mini/val --scale $$s --models bicubic nalasr-light-x$$s nalasr-light-x$$s@bf16 \
			--json benchmarks/results/sr_quality_bf16.json || exit 1; \
		$(BIN)/nala-sr evaluate --data datasets/photos/val --scale $$s --models bicubic nalasr-light-x$$s \
			nalasr-light-x$$s@bf16 --tile auto --memory-budget-mb 4096 \
			--json benchmarks/results/sr_quality_photos_bf16.json || exit 1; done; fi
	for m in $(DIGITS_MODELS); do \
		OMP_NUM_THREADS=1 $(BIN)/nala-gen quality -m $$m --per-class 100 --cfg 2 --json benchmarks/results/digits_quality.json || exit 1; done
	$(BIN)/python scripts/results_tables.py --write  # docs/results/tables/*.md and the README's headline table

# The shipped SR weights: CPU trainings in stages (x4: two on the embedded set, seven on the photo set; x2: one on the
# embedded set, four on the photo set; resumable), then export and evaluation.
SR_RUNS := NaLaSR/train_NaLaSR_light_x4_mini NaLaSR/train_NaLaSR_light_x4_mini_ft ESRT/train_ESRT_x4_mini \
	ESRT/train_ESRT_x4_mini_ft NaLaSR/train_NaLaSR_light_x2_mini \
	NaLaSR/train_NaLaSR_light_x4_photos_ft ESRT/train_ESRT_x4_photos_ft NaLaSR/train_NaLaSR_light_x2_photos_ft \
	NaLaSR/train_NaLaSR_light_x4_photos_stage4 ESRT/train_ESRT_x4_photos_stage4 NaLaSR/train_NaLaSR_light_x2_photos_stage3 \
	NaLaSR/train_NaLaSR_light_x4_photos_stage5 ESRT/train_ESRT_x4_photos_stage5 \
	NaLaSR/train_NaLaSR_light_x4_photos_stage6 ESRT/train_ESRT_x4_photos_stage6 NaLaSR/train_NaLaSR_light_x2_photos_stage4 \
	NaLaSR/train_NaLaSR_light_x2_photos_stage5 NaLaSR/train_NaLaSR_light_x4_photos_stage7 ESRT/train_ESRT_x4_photos_stage7 \
	NaLaSR/train_NaLaSR_light_x4_photos_stage8 ESRT/train_ESRT_x4_photos_stage8 \
	NaLaSR/train_NaLaSR_light_x4_photos_stage9 ESRT/train_ESRT_x4_photos_stage9 \
	NaLaSR/train_NaLaSR_light_x4_sets
weights-sr: $(STAMP)
	test -d datasets/mini || $(BIN)/nala-sr prepare mini
	test -d datasets/photos || $(BIN)/nala-sr prepare photos --install  # Debian's wallpaper packages (root)
	test -d datasets/train -a -d datasets/Urban100 || $(MAKE) sr-data  # stage 10: the 490 photographs, the test sets
	for run in $(SR_RUNS); do $(BIN)/python -m nala_gen.sr.train -opt options/train/$$run.yml --auto_resume || exit 1; done
	PATH=$(BIN):$$PATH $(BIN)/python scripts/ship_sr_weights.py

# The shipped digits pipelines: five CPU trainings (about an hour each; resumable), then export to weights/. The
# block pair now starts its attention neutral; the shipped block pair started from Xavier weights (their cards).
DIGITS_RUNS := naladit_digits:naladit-digits nalasit_digits:nalasit-digits naladit_digits_softmax:naladit-digits-softmax \
	naladit_digits_block:naladit-digits-block naladit_digits_softmax_block:naladit-digits-softmax-block
weights-diffusion: $(STAMP)
	for run in $(DIGITS_RUNS); do \
		cfg=$${run%%:*}; name=$${run##*:}; \
		$(BIN)/nala-gen train --config options/diffusion/$$cfg.yml --resume latest || exit 1; \
		$(BIN)/nala-gen export experiments/$$cfg --name $$name --out weights || exit 1; done

clean:
	rm -rf $(VENV) outputs site .pytest_cache .ruff_cache *.egg-info build nala_gen/ops/_*.so nala_gen/attention/_nala_fused*.so nala_gen/sr/_winograd*.so
