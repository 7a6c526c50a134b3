# Targets for developing acemq/outbox. `make help` lists them.
SHELL := /bin/bash
GO ?= go
ITERATIONS ?= 1
BENCH ?= .

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z/]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: test
test: ## run every test with the race detector against local PostgreSQL, MariaDB and RabbitMQ (the ordered chaos test on 5,000 messages; the relay's fault tests and the chaos test on both PostgreSQL layouts)
	OUTBOX_CHAOS_MESSAGES=5000 $(GO) test -race -count=1 -timeout 8m ./...

.PHONY: test/chaos
test/chaos: ## the ordered chaos test at full size (20,000 messages, four relays, kills), on both PostgreSQL layouts and on MariaDB
	$(GO) test -race -count=1 -timeout 8m -run 'TestOrderedChaos|TestMySQLOrderedChaos' -v ./relay

.PHONY: test/soak
test/soak: ## duplicates per fault kind, alone and together, with outbox verify (stops RabbitMQ's application: a broker of its own; ~15 min a layout)
	OUTBOX_SOAK_TEST=1 $(GO) test -count=1 -timeout 60m -run TestDuplicatesSoak -v ./cmd/outbox

.PHONY: test/failover
test/failover: ## promote a PostgreSQL standby under load (a primary and standby of the test's own, from PostgreSQL's binaries): sync, async and fenced, both layouts, RUNS=3 each (~20 min)
	OUTBOX_FAILOVER_TEST=1 OUTBOX_FAILOVER_RUNS=$(or $(RUNS),3) $(GO) test -count=1 -timeout 60m -run TestFailover -v ./cmd/outbox

.PHONY: test/log
test/log: ## the relay's whole suite with the log layout as its default (OUTBOX_TEST_LAYOUT=log): the tests that run on one layout run on it too
	OUTBOX_TEST_LAYOUT=log $(GO) test -race -count=1 -timeout 8m ./relay

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

.PHONY: bench
bench: ## run the benchmarks; ITERATIONS=N runs each N times (default 1, a smoke run)
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchtime=$(ITERATIONS)x -benchmem ./...

.PHONY: bench/smoke
bench/smoke: ## every benchmark once, on small inputs (what CI runs)
	OUTBOX_BENCH_HISTORY=20000 OUTBOX_BENCH_MESSAGES=2000 OUTBOX_BENCH_SECONDS=1 OUTBOX_BENCH_PURGE_EVENTS=20000 \
		$(GO) test -run='^$$' -bench=. -benchtime=1x ./... > /dev/null

.PHONY: generate
generate: ## regenerate migrations/ and the ent code (tests and examples)
	$(GO) test -run TestMigrationsMatchSchema -update . ./inbox
	$(GO) generate ./...

.PHONY: demo
demo: ## run examples/gorm, starting PostgreSQL and RabbitMQ with Docker if they do not answer locally
	@if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null || ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then \
		echo "demo: starting PostgreSQL and RabbitMQ with docker compose"; \
		docker compose up -d --wait; \
	fi
	$(GO) run ./examples/gorm

.PHONY: compose/up
compose/up: ## start PostgreSQL and RabbitMQ with Docker (for machines without them)
	docker compose up -d --wait

.PHONY: compose/down
compose/down: ## stop them
	docker compose down
