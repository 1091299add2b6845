# teifleet's entry points. `make test` is what CI runs.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export TEIFLEET_CACHE ?= $(HOME)/.cache/teifleet
export TEIFLEET_CLUSTER_DIR ?= $(CURDIR)/.cluster
BIN := $(TEIFLEET_CACHE)/current
# The cargo-deny that tests/cluster/prereqs.sh installs (its version is pinned there).
CARGO_DENY_VERSION := $(shell sed -n 's/^CARGO_DENY_VERSION=//p' tests/cluster/prereqs.sh)
CARGO_DENY := $(TEIFLEET_CACHE)/cargo-deny-$(CARGO_DENY_VERSION)/bin/cargo-deny
KUBECONFIG_FILE := $(TEIFLEET_CLUSTER_DIR)/kubeconfig
# The CRDs crdgen prints, each written to crds/teifleet.dev_<plural>.yaml and copied into the chart.
CRDS := embeddingpools embeddingjobs
# Every crate's modules, which `make lint` checks for import circles (tools/rooms.py --no-circles).
CRATE_SRCS := batch/src bench/src bench/load/src crds/src jobs/src multiplexer/src operator/src proto/src runtime/src \
	tools/device-plugin/src tools/tei-sim/src tools/testkit/src wire/src tests/e2e/src
CHART := charts/teifleet
CHART_GOLDEN := tests/chart/golden.yaml
MANIFESTS := deploy/manifests/teifleet-operator.yaml
MANIFEST_ARGS := teifleet $(CHART) --namespace teifleet-system --kube-version 1.33.0 --include-crds
CHART_TEMPLATE_ARGS := teifleet $(CHART) --namespace teifleet-system --kube-version 1.33.0 --set serviceMonitor.enabled=true
# Where `make push` and `make chart-push` publish; the chart and the operator default to ghcr.io/teifleet.
REGISTRY ?= ghcr.io/teifleet
CHART_REGISTRY ?= oci://$(REGISTRY)/charts
IMAGE_CRATES := -p teifleet-operator -p teifleet-multiplexer -p teifleet-tei-sim -p teifleet-job -p teifleet-batch
# The release binaries with the multiplexer profile-guided (tools/pgo.sh): what the images ship and
# `make bench` measures.
PGO_BIN := target/release-pgo
# Which multiplexer `make images` puts in its image: 1, profile-guided (tools/pgo.sh: about 11 minutes
# on 2 cores, what releases ship); 0, the plain release build; cached, the profile-guided one already
# in $(PGO_BIN) when tools/pgo.sh ran after the multiplexer's last rebuild, else the plain one (what
# `make demo` asks for). The images are otherwise the same.
IMAGES_PGO ?= 1

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

.PHONY: prereqs
prereqs: ## Install what builds and tests need (Debian packages, Rust components, cluster binaries)
	tests/cluster/prereqs.sh

.PHONY: test
test: prereqs lint deny unit test-clients test-observability check-generated chart-check test-cluster test-images ## Everything CI runs

.PHONY: lint
lint: ## cargo fmt --check, clippy -D warnings, the multiplexer's rooms importing only downward, no crate's modules importing in a circle, and the e2e tests sharing make unit's build
	cargo fmt --all -- --check
	tools/rooms.py --check multiplexer/src
	tools/rooms.py --no-circles $(CRATE_SRCS)
	tools/feature-drift.sh
	cargo clippy --workspace --all-targets --locked -- -D warnings

.PHONY: deny
deny: ## cargo deny: licenses, bans and sources (deny.toml says why advisories are not checked)
	$(CARGO_DENY) --locked check --hide-inclusion-graph licenses bans sources

.PHONY: unit
unit: ## Unit and golden tests (no cluster); the embedding-job runner's and the batch API's S3 tests against SeaweedFS (tools/seaweedfs.sh); the cache tests against redis-server
	TEIFLEET_WEED_BIN=$$(tools/seaweedfs.sh) TEIFLEET_REQUIRE_S3=1 TEIFLEET_REQUIRE_REDIS=1 cargo test --workspace --locked --exclude teifleet-e2e

.PHONY: fuzz
fuzz: ## Property fuzzing of the wire reader, HTTP parsers and request metadata, long: PROPTEST_CASES=200000 (about 7 min)
	PROPTEST_CASES=$${PROPTEST_CASES:-200000} cargo test --locked -p teifleet-multiplexer --test it fuzz:: -- --test-threads=2

.PHONY: test-clients
test-clients: ## Real HTTP clients from PyPI (openai, huggingface_hub, requests) against the multiplexer's HTTP front and tei-sim
	tests/clients/run.sh

.PHONY: test-observability
test-observability: ## The alert rules (promtool check and unit tests, and one fired on a real Prometheus under a burst) and every dashboard and rule query naming only metrics the binaries export
	tests/observability/run.sh

.PHONY: generate
generate: ## Regenerate the CRDs' YAML, the chart's copies and the plain manifests
	mkdir -p $(CHART)/crds
	tools/build-debug.sh --quiet
	for crd in $(CRDS); do \
	  target/debug/crdgen $$crd > crds/teifleet.dev_$$crd.yaml; \
	  cp crds/teifleet.dev_$$crd.yaml $(CHART)/crds/; \
	done
	$(BIN)/helm template $(MANIFEST_ARGS) > $(MANIFESTS)

.PHONY: check-generated
check-generated: ## Fail when checked-in generated files differ from what the code generates
	@tools/build-debug.sh --quiet
	@tmp=$$(mktemp -d); \
	for crd in $(CRDS); do \
	  file=crds/teifleet.dev_$$crd.yaml; \
	  target/debug/crdgen $$crd > $$tmp/$$crd.yaml; \
	  diff -u $$file $$tmp/$$crd.yaml || { echo "$$file is stale: run make generate"; exit 1; }; \
	  diff -u $$file $(CHART)/crds/teifleet.dev_$$crd.yaml || { echo "the chart's copy of $$file is stale: run make generate"; exit 1; }; \
	done; \
	extra=$$(ls $(CHART)/crds | grep -vxF -f <(printf 'teifleet.dev_%s.yaml\n' $(CRDS)) || true); \
	[[ -z "$$extra" ]] || { echo "the chart carries CRDs crdgen does not print: $$extra"; exit 1; }; \
	$(BIN)/helm template $(MANIFEST_ARGS) > $$tmp/manifests.yaml; \
	diff -u $(MANIFESTS) $$tmp/manifests.yaml || { echo "$(MANIFESTS) is stale: run make generate"; exit 1; }; \
	rm -rf $$tmp

.PHONY: chart-check
chart-check: ## helm lint and the golden `helm template` check
	$(BIN)/helm lint --strict $(CHART)
	$(BIN)/helm lint --strict $(CHART) --set serviceMonitor.enabled=true
	@$(BIN)/helm template $(CHART_TEMPLATE_ARGS) > /tmp/teifleet-chart.yaml; \
	diff -u $(CHART_GOLDEN) /tmp/teifleet-chart.yaml || { echo "chart output changed: review, then make chart-golden"; exit 1; }
	@# List items in block (- x) or flow ([a, "x"]) style.
	@! grep -nE "(^\s*-\s*|[[,]\s*)[\"']?\*[\"']?\s*($$|[],])" /tmp/teifleet-chart.yaml || { echo "the chart's RBAC must not use wildcards"; exit 1; }
	@# Secrets: create alone (each pool's peer Secret), never get/list/watch/update.
	@tests/chart/secrets-rule.sh /tmp/teifleet-chart.yaml
	@! grep -nE "(^\s*-\s*|[[,]\s*)[\"']?clusterroles[\"']?\s*($$|[],])" /tmp/teifleet-chart.yaml || { echo "the chart's RBAC must not touch ClusterRoles: escalate and bind stay namespaced"; exit 1; }

.PHONY: chart-golden
chart-golden: ## Rewrite the chart's golden template output
	$(BIN)/helm template $(CHART_TEMPLATE_ARGS) > $(CHART_GOLDEN)

.PHONY: cluster-up
cluster-up: ## Start the local control plane (etcd, apiserver, controller-manager, scheduler, kwok) and one real node (TEIFLEET_REAL_NODE=0: none)
	TEIFLEET_REAL_NODE=$(if $(TEIFLEET_REAL_NODE),$(TEIFLEET_REAL_NODE),1) tests/cluster/up.sh
	@echo "export KUBECONFIG=$(KUBECONFIG_FILE)"

.PHONY: cluster-down
cluster-down: ## Stop the local control plane
	tests/cluster/down.sh

.PHONY: test-cluster
test-cluster: ## End-to-end tests on a fresh local control plane with its real node (TEIFLEET_REAL_NODE=0: without)
	@# make unit's build (nothing to compile after it), then the e2e tests, whose shared
	@# dependencies tools/feature-drift.sh keeps on that same build.
	tools/build-debug.sh
	cargo test --locked -p teifleet-e2e --no-run
	@# The real-pod tests run the images: build them from the debug binaries unless images newer than those exist.
	images=target/images/images.txt; \
	[[ -f $$images && $$images -nt target/debug/teifleet-operator && $$images -nt target/debug/teifleet-multiplexer \
	   && $$images -nt target/debug/tei-sim && $$images -nt target/debug/teifleet-job \
	   && $$images -nt target/debug/teifleet-batch ]] || REGISTRY=ghcr.io/teifleet images/build.sh --bin-dir target/debug --out target/images
	tests/cluster/down.sh
	trap 'tests/cluster/down.sh' EXIT; \
	export TEIFLEET_REAL_NODE=$(if $(TEIFLEET_REAL_NODE),$(TEIFLEET_REAL_NODE),1); \
	TEIFLEET_FAKE_GPU_PLUGIN_BIN=$(CURDIR)/target/debug/teifleet-fake-gpu-plugin tests/cluster/up.sh; \
	TEIFLEET_KUBECONFIG=$(KUBECONFIG_FILE) TEIFLEET_OPERATOR_BIN=$(CURDIR)/target/debug/teifleet-operator \
	  TEIFLEET_MULTIPLEXER_BIN=$(CURDIR)/target/debug/teifleet-multiplexer \
	  TEIFLEET_PROMETHEUS_BIN=$$(tools/prometheus.sh) \
	  cargo test --locked -p teifleet-e2e -- --test-threads=1

.PHONY: images
images: ## Build the operator, multiplexer (profile-guided: tools/pgo.sh; IMAGES_PGO=0 plain), tei-sim, job and batch images into target/images, without Docker; prints sizes and digests
	cargo build --release --locked $(IMAGE_CRATES) -p teifleet-load --bins
	@# A cached profile-guided build counts only when it is newer than the release multiplexer, which
	@# cargo rebuilt just now if anything it is made of changed since.
	@bins=target/release; \
	case "$(IMAGES_PGO)" in \
	  1) tools/pgo.sh --out $(PGO_BIN); bins=$(PGO_BIN) ;; \
	  0) ;; \
	  cached) \
	    if [[ -x $(PGO_BIN)/teifleet-multiplexer && $(PGO_BIN)/teifleet-multiplexer -nt target/release/teifleet-multiplexer ]]; then \
	      bins=$(PGO_BIN); \
	      for binary in target/release/*; do \
	        [[ -f $$binary && -x $$binary && ! -e $(PGO_BIN)/$${binary##*/} ]] && ln -s $(CURDIR)/$$binary $(PGO_BIN)/ || true; \
	      done; \
	    fi ;; \
	  *) echo "IMAGES_PGO is 1, 0 or cached, not $(IMAGES_PGO)" >&2; exit 2 ;; \
	esac; \
	if [[ $$bins == $(PGO_BIN) ]]; then \
	  echo "[images] the multiplexer profile-guided: $$(head -n 1 $(PGO_BIN)/BUILD)"; \
	else \
	  echo "[images] the multiplexer from the plain release build (IMAGES_PGO=$(IMAGES_PGO); make images profile-guides it)"; \
	fi; \
	REGISTRY=$(REGISTRY) images/build.sh --bin-dir $$bins --out target/images

.PHONY: push
push: images ## Push the images to REGISTRY with crane (make push REGISTRY=ghcr.io/<you>)
	REGISTRY=$(REGISTRY) images/push.sh --out target/images

.PHONY: chart-push
chart-push: ## Package the chart and push it to CHART_REGISTRY (default oci://$(REGISTRY)/charts)
	CHART_REGISTRY=$(CHART_REGISTRY) images/push-chart.sh --out target/images

.PHONY: images-check
images-check: ## Release images built twice (same digests), their binaries run, pushed with the chart to a local registry
	cargo build --release --locked $(IMAGE_CRATES) -p teifleet-load --bins
	tools/pgo.sh --out $(PGO_BIN)
	images/check.sh --bin-dir $(PGO_BIN)

.PHONY: test-images
test-images: ## images-check on the debug binaries test-cluster built (no release build): what make test runs
	images/check.sh --bin-dir target/debug

.PHONY: demo
demo: ## The whole story as shipped (root): images (plain release, no PGO wait) on a real node, chart, a pool Running, gRPC/HTTP via its Service, bursts, live limits, an EmbeddingJob, GPU shortage, autoscaling from zero and back; each phase timed
	DEMO_STARTED_MS=$$(date +%s%3N) tests/demo.sh

.PHONY: demo-down
demo-down: ## Stop what `DEMO_KEEP=1 make demo` left running (the relay it recorded, and its cluster with the real node)
	@# Only PIDs the demo recorded, and only while they still run the program it started.
	@if [ -f target/demo-logs/pids ]; then \
	  while read -r pid program; do \
	    if [ "$$(tr '\0' '\n' < /proc/$$pid/cmdline 2>/dev/null | head -n 1)" = "$$program" ]; then kill "$$pid"; fi; \
	  done < target/demo-logs/pids; \
	  rm -f target/demo-logs/pids; \
	fi
	tests/cluster/down.sh

.PHONY: bench
bench: ## Benchmarks 1–23, direct vs multiplexer (vs a bare proxy; 21 against a real TEI when ../shared/tools/real-tei.sh built one), PASS/FAIL per target; writes bench/results/<date>.{md,json,svg} (about 30 min after the builds)
	cargo build --release --locked -p teifleet-bench -p teifleet-load -p teifleet-tei-sim -p teifleet-multiplexer -p teifleet-operator -p teifleet-job --bins
	tools/pgo.sh --out $(PGO_BIN) --with-floor-proxy
	TEIFLEET_BENCH_BIN_DIR=$(PGO_BIN) bench/run.sh full

.PHONY: bench-quick
bench-quick: ## The same benchmarks, shorter (about 8 min after the build); results in target/bench-quick
	cargo build --release --locked -p teifleet-bench -p teifleet-load -p teifleet-tei-sim -p teifleet-multiplexer -p teifleet-operator -p teifleet-job --bins
	tools/pgo.sh --out $(PGO_BIN) --with-floor-proxy
	TEIFLEET_BENCH_BIN_DIR=$(PGO_BIN) bench/run.sh quick
