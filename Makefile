# Targets for developing acemq/outbox. `make help` lists them.
GO ?= go
ITERATIONS ?= 1
BENCH ?= .

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z/]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: test
test: ## run every test with the race detector against local PostgreSQL and RabbitMQ
	$(GO) test -race -count=1 -timeout 8m ./...

.PHONY: test/long
test/long: ## also run the slow reliability suites (OUTBOX_LONG=1)
	OUTBOX_LONG=1 $(GO) test -race -count=1 -timeout 30m ./...

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

.PHONY: bench
bench: ## run the benchmarks; ITERATIONS=N runs each N times (default 1, a smoke run)
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchtime=$(ITERATIONS)x -benchmem ./...

.PHONY: generate
generate: ## regenerate migrations/ and the ent test schema
	$(GO) test -run TestMigrationsMatchSchema -update .
	$(GO) generate ./...

.PHONY: compose/up
compose/up: ## start PostgreSQL and RabbitMQ with Docker (for machines without them)
	docker compose up -d --wait

.PHONY: compose/down
compose/down: ## stop them
	docker compose down
