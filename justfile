# Recipes; `./dev RECIPE` installs what they need first.

# Build (release) and run the daemon; extra arguments go to `wallscope serve`.
run *ARGS:
    scripts/deps.sh
    cargo build --release
    ./target/release/wallscope serve {{ARGS}}

# Formatting, lints and every test. eBPF tests need root; with CI=true they
# fail instead of skipping without it. Their daemons run with exactly the
# capabilities of deploy/wallscope.service (tests/support/caps.rs).
test:
    scripts/deps.sh
    cargo fmt --check
    cargo clippy --all-targets --quiet -- -D warnings
    WALLSCOPE_TEST_UNIT_CAPS=1 cargo test --no-fail-fast

# Overhead benchmarks against the reference tools; results in bench/results/.
bench:
    scripts/deps.sh bench
    cargo build --release
    cargo bench --bench oncpu
    cargo bench --bench offcpu
    cargo bench --bench walk
    cargo bench --bench jvm
    cargo bench --bench jvm_cost
    cargo bench --bench jvm_symbols
    cargo bench --bench unwind
    cargo bench --bench short_lived
    cargo bench --bench soak
    cargo bench --bench web
    cargo bench --bench python
    cargo bench --bench otel_ctx
    cargo bench --bench push
    cargo bench --bench history
    cargo bench --bench history_query
    COST_BENCH_PEER=1 cargo bench --bench cost
    cargo bench --bench history_disk --features compare-stores

# Rewrite every golden file in tests/golden/ after an intended output
# change: BLESS=1 on each golden test (all have `golden` in their path:
# the renderer's and pprof's unit tests, the e2e binary's `golden` module).
bless:
    BLESS=1 cargo test golden
