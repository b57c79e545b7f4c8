# Two commands set everything up on a fresh machine: `make dev` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The security scanner the suite runs on the stacks and the Dockerfile (deploy/test_scanners.py), in a virtualenv of
# its own: checkov pins its own versions of libraries the project also uses (boto3 among them).
CHECKOV_VERSION := 3.3.30
CHECKOV := .ddb_athena/tools/checkov/bin/checkov
# cfn-guard 3.1 and AWS Control Tower's guard rules, as AWS ships them in one npm package (deploy/test_scanners.py).
CFN_GUARD_PACKAGE := @cdklabs/cdk-validator-cfnguard@0.0.62
CFN_GUARD := .ddb_athena/tools/cfn-guard/node_modules/@cdklabs/cdk-validator-cfnguard/package.json
# pip-tools, for `make lock` only (its own virtualenv).
PIP_TOOLS := .ddb_athena/tools/pip-tools/bin/pip-compile

.PHONY: install test test-image test-image-arm64 test-fast test-soak dev templates bench bench-calibrate bench-platform bench-bootstrap bench-capture bench-cost bench-freshness bench-interruption bench-requests bench-volume bench-sync-cpu bench-sync-phases bench-parity bench-many-declarations faults lambda emr-job lint lock clean

install: $(INSTALLED) $(CHECKOV) $(CFN_GUARD)
	@# Cheap when the JARs are cached (.ddb_athena/jars); builds or fetches whatever is missing, and dumps the archive of
	@# Spark's classes its sessions start from (~40 s, once).
	@$(BIN)/python -m ddb_athena_build.jars >/dev/null
	@$(BIN)/python -m ddb_athena_build.class_archive >/dev/null

$(CHECKOV):
	$(PYTHON) -m venv .ddb_athena/tools/checkov
	.ddb_athena/tools/checkov/bin/python -m pip install --quiet checkov==$(CHECKOV_VERSION)

$(PIP_TOOLS):
	$(PYTHON) -m venv .ddb_athena/tools/pip-tools
	.ddb_athena/tools/pip-tools/bin/python -m pip install --quiet pip-tools==7.7.0

$(CFN_GUARD):
	npm install --silent --no-audit --no-fund --prefix .ddb_athena/tools/cfn-guard $(CFN_GUARD_PACKAGE)

$(INSTALLED): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,test,bench]'
	touch $@

# The suite on TEST_WORKERS processes, each with its own emulator and Spark session (the stack tests on one of them,
# first), listing its 25 slowest tests; then the IAM coverage tests, on the AWS calls every worker saved ($(2): which).
# The tiers are markers (setup.cfg): `make test` is what CI runs; `make test-fast`, the inner loop, leaves out every
# test that needs a JVM or a process of its own; `make test-soak` runs what needs minutes of real time.
TEST_WORKERS ?= 3
AWS_CALLS := .ddb_athena/test-aws-calls
define run_suite
	rm -rf $(AWS_CALLS)
	$(BIN)/python -m pytest ddb_athena_tests -n $(TEST_WORKERS) --dist loadgroup --durations 25 --aws-calls-dir $(AWS_CALLS) $(1)
	$(BIN)/python -m pytest ddb_athena_tests/deploy/test_iam_coverage.py -m suite_calls --aws-calls-dir $(AWS_CALLS) $(2)
endef

test: install lint
	$(call run_suite,-m "not soak and not image")

# Without every test's calls, only that each call is allowed (not that each grant is called).
test-fast: install lint
	$(call run_suite,-m "not jvm and not subprocess and not stack and not soak and not image",-k every_call_is_allowed)

# Minutes of real time each (the fault harness's short run, the sync's handovers with runs starting 90 s late), one after
# the other: run it whenever a change touches the handover, the leases, the run loop or the harness.
test-soak: install
	$(BIN)/python -m pytest ddb_athena_tests -m soak --durations 0

# The deployment image built and run (deploy/Dockerfile): Docker from Debian's packages where this runs as root.
test-image: install
	bash scripts/test_image.sh

# The same for the Graviton image (linux/arm64), through QEMU on an x86 machine: slow, so not part of CI.
test-image-arm64: install
	ARCH=arm64 bash scripts/test_image.sh

# The image's Python distributions, each pinned by version and hash (deploy/Dockerfile installs only these): run after
# a change to setup.py's requirements (a test fails until then); it keeps every pin it can. `make lock UPGRADE=--upgrade`
# takes the newest releases the requirements allow. Needs the package index.
LOCK_OPTIONS := --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links
lock: $(PIP_TOOLS)
	$(PIP_TOOLS) $(LOCK_OPTIONS) $(UPGRADE) --extra deploy --output-file deploy/requirements.lock setup.py
	$(PIP_TOOLS) $(LOCK_OPTIONS) $(UPGRADE) --output-file deploy/build-requirements.lock deploy/build-requirements.in

lint: install
	$(BIN)/ruff check ddb_athena ddb_athena_build ddb_athena_tests ddb_athena_bench ddb_athena_faults
	$(BIN)/ruff format --check ddb_athena ddb_athena_build ddb_athena_tests ddb_athena_bench ddb_athena_faults

dev: install
	bash scripts/dev.sh

bench: install
	$(BIN)/python -m ddb_athena_bench.books_merge
	$(BIN)/python -m ddb_athena_bench.orders_load

# Peak RSS of a books bootstrap's scan of 100k and 1M items of ~1 KB: snapshot parts of 64 MB against one object.
# The platform task's memory and CPU (deploy/dagster_ecs.yaml's sizes): its container, idle but ticking, over MINUTES.
# Needs Docker and an image built from deploy/Dockerfile (IMAGE; see ddb_athena_bench/platform_size.py).
bench-platform: install
	$(BIN)/python -m ddb_athena_bench.platform_size $${IMAGE:+--image $$IMAGE} $${MINUTES:+--minutes $$MINUTES}

# The key parity check's whole look at 200k and 1M keys of ~1 KB (KEYS), the same on both sides: its seconds and the
# driver's peak RSS (Python and JVM), its DynamoDB a scan served from memory, unpaced.
bench-parity: install
	$(BIN)/python -m ddb_athena_bench.parity_memory --keys $${KEYS:-200000 1000000}

# The code location and the templates of many declared tables (TABLES: streamed,exported).
bench-many-declarations: install
	$(BIN)/python -m ddb_athena_bench.many_declarations --tables $${TABLES:-25,25}

bench-bootstrap: install
	$(BIN)/python -m ddb_athena_bench.bootstrap_memory

# Where a stream capture's time goes: the emulator's stream against one served from memory (the capture's own
# capacity), and the capture's CPU by step.
bench-capture: install
	$(BIN)/python -m ddb_athena_bench.capture_rate --records $${RECORDS:-20000}

# The real local stack for 30 minutes (a sync run's JVM takes the first few to warm up): freshness p50/p95/max,
# CPU per minute, file counts (report and chart in .ddb_athena/bench/). On an otherwise idle machine: it measures CPU.
# RUN_START_DELAY (seconds) starts every run worker that late, as an ECS task starts: the sync's handovers pay it.
bench-freshness: install
	$(BIN)/python -m ddb_athena_bench.freshness --minutes $${MINUTES:-30} $${RUN_START_DELAY:+--run-start-delay $$RUN_START_DELAY}

# ECS stopping the sync's task (a Fargate Spot interruption) at the requirement's rate, every run starting 90 s late.
bench-interruption: install
	$(BIN)/python -m ddb_athena_bench.interruption --rate $${RATE:-230} --warmup-minutes $${WARMUP:-5} --after-minutes $${AFTER:-5}

# The AWS requests of one sync cycle, counted by the emulator by step, operation and files (the warehouse on the
# emulator's S3): what the S3 bill is made of.
bench-requests: install
	$(BIN)/python -m ddb_athena_bench.commit_requests --cycles $${CYCLES:-30} --interval $${INTERVAL:-10} --rate $${RATE:-10}

# The real local stack under a load generator stepped through STEPS writes a second, then HOLD minutes at the last:
# freshness, the sync's CPU and memory, commits and requests per commit by rate (report and chart in .ddb_athena/bench/).
# WAREHOUSE=local: Iceberg's files in a directory, the sync's pace without the emulator serving them (not counted).
bench-volume: install
	$(BIN)/python -m ddb_athena_bench.volume --steps $${STEPS:-1,10,50,100,250} --step-minutes $${STEP_MINUTES:-5} --hold-minutes $${HOLD:-60} --warehouse $${WAREHOUSE:-emulator}

# The sync's own capacity past the emulator: the books sync cycle, with its checks and upkeep, against a table and
# stream served from memory at RATE writes a second of ~1 KB items; freshness record by record, CPU, memory.
bench-sync-capacity: install
	$(BIN)/python -m ddb_athena_bench.sync_capacity --rate $${RATE:-250} --minutes $${MINUTES:-10}

# The books sync's monthly bill on AWS, from what it does here: its own loop at RATES writes a second for each of
# INTERVALS (seconds), within a task of VCPU and MEMORY_GB (a CPU quota and a memory limit: root, cgroup v1; the JVM's
# heap SPARK_MEMORY), a 1 GB table, every request counted by step and priced (ddb_athena_bench/prices.py). WRITE_DOCS=1
# writes docs/cost.md from every cell measured so far (docs/cost-cells.json, versioned; DOCS_ONLY=1 measures nothing).
# Each cell runs MINUTES (30: two maintenance passes). COPIES=10: books ten times its 1 GB (copied by Spark).
# STAGES=1: Spark's event log kept, each cell's statements printed by their stages' metrics (stage_metrics.py).
bench-cost: install
	$(BIN)/python -m ddb_athena_bench.cost --rates $${RATES:-1,10,100,230} --intervals $${INTERVALS:-10,20,30,60,120} --minutes $${MINUTES:-30} \
		$${VCPU:+--vcpu $$VCPU} $${MEMORY_GB:+--memory-gb $$MEMORY_GB} $${SPARK_MEMORY:+--spark-memory $$SPARK_MEMORY} $${WRITE_DOCS:+--write-docs} $${DOCS_ONLY:+--docs-only} \
		--tables-beside $${TABLES_BESIDE:-0} --beside-rate $${BESIDE_RATE:-2} $${BESIDE_INTERVAL:+--beside-interval $$BESIDE_INTERVAL} $${COPIES:+--copies $$COPIES} $${STAGES:+--spark-event-log}

# How fast this host is now: the CPU seconds of fixed Python and Spark work. Run it before and after each cell of a
# before/after (A B B A): the same code measures a third slower on a slow hour here. ROUNDS warm Spark rounds.
bench-calibrate: install
	$(BIN)/python -m ddb_athena_bench.calibrate --rounds $${ROUNDS:-5}

# Where a warm sync cycle's CPU goes (no Dagster; per minute, by JVM thread kind, Spark jobs per cycle).
bench-sync-cpu: install
	$(BIN)/python -m ddb_athena_bench.sync_cpu --minutes $${MINUTES:-5} --interval $${INTERVAL:-10}

# A warm sync cycle's CPU by step; with SETTINGS (a JSON object of Spark runtime settings), cycles alternate between
# the session's own settings and these, in one session (an A/B that host drift does not blur).
bench-sync-phases: install
	$(BIN)/python -m ddb_athena_bench.sync_phases --cycles $${CYCLES:-40} --interval $${INTERVAL:-5} --settings "$${SETTINGS:-{\}}"

# The real local stack under writes on books and reviews while a nemesis injects faults for MINUTES (seeded by SEED):
# kills, pauses and Spot interruptions of the sync, Terminate and Re-execute, Materialize and bootstraps beside it,
# endpoint restarts, S3/DynamoDB throttles, 500s and lost responses (a proxy), a writer's clock skewed (`faketime`).
# Reports faults by kind, recoveries p50/max and anomalies by kind (.ddb_athena/bench/faults/); exit 1 on any anomaly.
faults: install
	$(BIN)/python -m ddb_athena_faults.harness --minutes $${MINUTES:-60} --seed $${SEED:-0}

# The CloudFormation templates for the declared tables (ddb_athena/tables.toml), rendered to build/deploy/: deploy those.
templates: $(INSTALLED)
	$(BIN)/python -m ddb_athena_build.templates

# The capture Lambda's deployment zip (.ddb_athena/dist/capture-lambda.zip): the handler and what it imports.
lambda: $(INSTALLED)
	$(BIN)/python -m ddb_athena_build.packaging lambda

# The orders load job for EMR Serverless (.ddb_athena/dist/emr/): its entry point and a --py-files archive of the
# modules it imports (the package's and dagster-pipes); upload both to DDB_ATHENA_EMR_CODE_URI (docs/operations.md).
emr-job: $(INSTALLED)
	$(BIN)/python -m ddb_athena_build.packaging emr-job

clean:
	rm -rf $(VENV) .ddb_athena .dagster_home *.egg-info
