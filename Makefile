# The CPU wheel of torch that lies on these machines; override with e.g. `make install TORCH=torch`.
TORCH ?= torch==2.13.0
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TF := $(BIN)/tf

CONFIG ?= configs/small.yaml
RUN ?= runs/$(basename $(notdir $(CONFIG)))
SRC ?= data/corpora/bible-es-en/test.es
REF ?= data/corpora/bible-es-en/test.en
BEAM ?= 5
# A multilingual run's output language for translate and eval (--to); empty for a one-way run.
TO ?=
TEACHER ?= runs/small
STUDENT_CONFIG ?= configs/student.yaml
STUDENT ?= $(TEACHER)-student
# The student's tokenizer: the teacher's by default; empty (STUDENT_TOKENIZER=) trains one of the
# student config's own size, as a small student of a large imported teacher (OPUS-MT's 65k
# pieces) wants.
STUDENT_TOKENIZER ?= $(TEACHER)/tokenizer

.PHONY: install test lint demo tokenizer train translate eval distill backtranslate bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,plot,export,serve,tensorboard,bench]"
	touch $@

# One pytest worker per core (TEST_WORKERS=0: one process), tests handed out as workers free
# up, a module marked xdist_group kept on one worker: most tests wait on a subprocess's start-up
# or on one thread, so two cores run the suite in about half the time. conftest.py gives each
# worker its share of the threads.
TEST_WORKERS ?= auto
test: install
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadgroup

lint: install
	$(BIN)/ruff check cli model data tests benchmarks
	$(BIN)/ruff format --check cli model data tests benchmarks

# Five minutes on a 2-core CPU: train a demo recipe on the embedded Spanish-English corpus for
# about 4 minutes, translate a few sentences, score the whole bundled test set. The recipe fits
# the CPU (`python -m cli.device --demo-config` says which and why): configs/demo.yaml where bf16
# runs natively, configs/demo-fp32.yaml (a narrower model, more updates in the time) elsewhere.
# DEMO_CONFIG: a recipe of your choice; DEMO_SET: more `--set`s (quote a value with spaces inside
# it: DEMO_SET="--set 'k=a b'"); DEMO_RUN: where the run goes.
DEMO_RUN ?= runs/demo
DEMO_SET ?=
DEMO_CONFIG ?=
demo: install
	config=$(or $(DEMO_CONFIG),$$($(BIN)/python -m cli.device --demo-config)) && \
		$(TF) train $$config --out $(DEMO_RUN) --force $(DEMO_SET)
	head -n 5 $(SRC) | $(TF) translate $(DEMO_RUN) --beam 4
	$(TF) eval $(DEMO_RUN) --src $(SRC) --ref $(REF)

tokenizer: install
	$(TF) tokenizer train $(CONFIG) --out $(RUN)/tokenizer

train: install
	$(TF) train $(CONFIG) --out $(RUN)

translate: install
	$(TF) translate $(RUN) -i $(SRC) -o $(RUN)/translation.txt --beam $(BEAM) $(if $(TO),--to $(TO))

eval: install
	$(TF) eval $(RUN) --src $(SRC) --ref $(REF) --beam $(BEAM) $(if $(TO),--to $(TO)) --json \
		> $(RUN)/.eval.json.partial \
		|| { rm -f $(RUN)/.eval.json.partial; exit 1; }
	mv $(RUN)/.eval.json.partial $(RUN)/eval.json
	cat $(RUN)/eval.json

# Sequence-level knowledge distillation: the teacher translates its training sources, a student
# trains on them (with the teacher's tokenizer, or its own: STUDENT_TOKENIZER), then both are
# compared on the test set. Each step is a plain `tf` command that resumes where a killed run
# stopped.
distill: install
	$(TF) distill $(TEACHER) --out $(TEACHER)/distilled --beam $(BEAM)
	if [ -f $(STUDENT)/config.yaml ]; then $(TF) train --resume $(STUDENT); else \
		$(TF) train $(STUDENT_CONFIG) --out $(STUDENT) --set data.train=$(TEACHER)/distilled/train \
			$(if $(STUDENT_TOKENIZER),--set data.tokenizer=$(STUDENT_TOKENIZER)); fi
	$(TF) compare $(TEACHER) $(STUDENT) --src $(SRC) --ref $(REF)

# Back-translation (Sennrich et al. 2016): a reverse model (target to source language) trained
# on PARALLEL translates MONO, text in the target language, with beam 5; the forward model
# trains on PARALLEL plus those pairs, tagged (Caswell et al. 2019), and is scored. By default
# the bundled pairs split by verse: half A's pairs, half B's English alone, and the recipe of
# configs/backtranslate.yaml (2,000 updates a model). Beam 5 and the tag were chosen on dev
# there (docs/recipes.md, "Back-translation"); sampling (Edunov et al. 2018,
# BT_SEARCH="--greedy --set decode.sampling_topk=10") pays with larger corpora and stronger
# reverse models.
# Each step is a plain `tf` command that resumes where a killed run stopped.
BT ?= runs/bt
BT_CONFIG ?= configs/backtranslate.yaml
PARALLEL ?= $(BT)/half-a
MONO ?= $(BT)/half-b.en
BT_SEARCH ?= --beam 5
BT_TAG ?= <bt>
BT_WEIGHT ?= 1
SRC_LANG ?= es
TGT_LANG ?= en

BT_CORPORA = data.train=[{corpus: "$(PARALLEL)", weight: $(BT_WEIGHT)}, \
	{corpus: "$(BT)/synthetic/train", tag: "$(BT_TAG)"}]

$(BT)/half-b.en:
	$(BIN)/python -m benchmarks.backtranslation split $(BT)

backtranslate: install $(MONO)
	if [ -f $(BT)/reverse/config.yaml ]; then $(TF) train --resume $(BT)/reverse; else \
		$(TF) train $(BT_CONFIG) --out $(BT)/reverse --set data.train=$(PARALLEL) \
			--set data.src_lang=$(TGT_LANG) --set data.tgt_lang=$(SRC_LANG); fi
	$(TF) backtranslate $(BT)/reverse $(MONO) --out $(BT)/synthetic $(BT_SEARCH)
	if [ -f $(BT)/forward/config.yaml ]; then $(TF) train --resume $(BT)/forward; else \
		$(TF) train $(BT_CONFIG) --out $(BT)/forward --set '$(BT_CORPORA)'; fi
	$(TF) eval $(BT)/forward --src $(SRC) --ref $(REF)

# Every benchmark, its tables and bench-out/bench.json; it prints its estimated time first (about
# half an hour on a 2-core CPU) and each section's time as it ends. QUICK=1: every table at a
# smaller size, about 5 minutes (`--quick`); `python -m benchmarks.run --smoke` checks that every
# section runs.
bench: install
	$(BIN)/python -m benchmarks.run $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) runs .pytest_cache
