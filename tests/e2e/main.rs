//! The end-to-end tests, one binary: a module per area (named as the test
//! binary it once was, so `cargo test --test e2e engine::` runs what
//! `--test engine` did), sharing `support`. Tests of the real daemon need
//! root and take a [`support::Fixture`]: its turn keeps timing- and
//! load-sensitive tests of different modules from running together, and
//! the daemon most of them watch is started once for the whole run.

mod support;

mod api;
mod api_access;
mod api_blocked;
mod api_load;
mod api_offcpu;
mod api_security;
mod api_spans;
mod api_ui;
mod api_windows;
mod architecture;
mod cli;
mod containers;
mod culprits;
mod deploy;
mod doc_examples;
mod ebpf;
mod engine;
mod explain;
mod golden;
mod groups;
mod history;
mod host;
mod http_limits;
mod hung;
mod identity;
mod jvm;
mod jvm_attach;
mod jvm_frames;
mod jvm_noflags;
mod jvm_start;
mod lifecycle;
mod memory_bounds;
mod memory_governor;
mod offcpu;
mod otel_capture;
mod otel_discovery;
mod otlp;
mod pid_reuse;
mod pprof;
mod push;
mod push_pace;
mod python;
mod scale;
mod security;
mod security_answers;
mod security_attach;
mod security_auth;
mod security_containers;
mod security_cpu;
mod security_disclosure;
mod security_jvm;
mod security_names;
mod security_queries;
mod security_shares;
mod security_slots;
mod spans;
mod spans_attacks;
mod stuck;
mod thread_fold;
mod throttling;
mod trace;
mod unwind;
mod unwind_crowded;
mod unwind_fair;
mod unwind_pending;
mod web_ui;
mod web_ui_host;
