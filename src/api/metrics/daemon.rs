//! The daemon's own series of `/metrics`: its memory, history, holders,
//! queries, HTTP server and pushes (a fixed set).

use super::{label, Out};
use crate::{
    api::{limit::QueryStats, memory::Rss},
    bpf::abi::Stat,
    profile::model::{
        spans_store::SpanStats,
        store::{HistoryState, StoreStats},
    },
    state::push::{Failure, PushReport},
    state::Health,
};

/// The daemon's own metrics: name and help (a counter if named `_total`).
const DAEMON: [(&str, &str); 7] = [
    ("wallscope_drains_total", "Drains of the BPF maps"),
    ("wallscope_drain_errors_total", "Failed drains"),
    (
        "wallscope_last_drain_seconds",
        "Duration of the last drain of the BPF maps",
    ),
    (
        "wallscope_last_symbolize_seconds",
        "Duration of the last symbolization",
    ),
    ("wallscope_stacks", "Distinct stacks in the store"),
    (
        "wallscope_daemon_cpu_seconds_total",
        "CPU time (user + system) of the wallscope daemon itself",
    ),
    (
        "wallscope_daemon_resident_memory_bytes",
        "Resident memory of the wallscope daemon itself",
    ),
];

/// The engine's series: BPF counters, stack walk cost, refusals, CPU
/// budgets, dropped work, and the daemon's drains, stacks, CPU and memory.
pub(super) fn engine_series(
    out: &mut Out,
    totals: &[u64; Stat::COUNT],
    health: &Health,
    stacks: usize,
) {
    let name = "wallscope_bpf_events_total";
    let help = "BPF-side event and loss counters since start";
    out.family(name, "counter", help);
    for stat in Stat::ALL {
        out.sample(name, &label("counter", stat.name()), totals[stat as usize]);
    }
    let name = "wallscope_stack_walk_seconds";
    let help = "Time BPF stack walks took since start, by what was walked and frames found (slot upper bounds)";
    out.family(name, "summary", help);
    for w in &health.walk_cost {
        let frames = if w.frames_to == u32::MAX {
            format!("{}+", w.frames_from)
        } else {
            format!("{}-{}", w.frames_from, w.frames_to)
        };
        let labels = format!("{},{}", label("kind", w.kind), label("frames", &frames));
        for (q, ns) in [("0.5", w.p50_ns), ("0.99", w.p99_ns)] {
            let labels = format!("{labels},{}", label("quantile", q));
            out.sample(name, &labels, ns as f64 / 1e9);
        }
        out.sample(&format!("{name}_count"), &labels, w.walks);
    }
    let name = "wallscope_refused_total";
    let help = "Files and sockets of profiled processes refused (symlink, FIFO, owner, size...), by what and why";
    out.family(name, "counter", help);
    for (what, reason, n) in crate::untrusted::refusals::all() {
        let labels = format!(
            "{},{}",
            label("what", what.name()),
            label("reason", reason.name())
        );
        out.sample(name, &labels, n);
    }
    let name = "wallscope_user_cpu_seconds_total";
    let help = "CPU time of work done on processes' behalf (perf maps, JVM and CPython memory, JVM attach) charged to their users' budgets, by pool (root's processes, or every other user's), since start";
    out.family(name, "counter", help);
    let pools = crate::budget::cpu::totals();
    for (pool, t) in &pools {
        out.sample(name, &label("pool", pool.name()), t.cpu_ns as f64 / 1e9);
    }
    let name = "wallscope_user_cpu_refused_total";
    let help =
        "Units of that work skipped because their user was over budget, by pool, since start";
    out.family(name, "counter", help);
    for (pool, t) in &pools {
        out.sample(name, &label("pool", pool.name()), t.refused);
    }
    let name = "wallscope_pipeline_dropped_total";
    let help = "Work the daemon dropped rather than queue without bound";
    out.family(name, "counter", help);
    out.sample(name, &label("what", "batch"), health.batches_dropped);
    out.sample(
        name,
        &label("what", "jvm_sighting"),
        health.jvm_sightings_dropped,
    );
    let secs = |us: u64| Some(us as f64 / 1e6);
    let values = [
        Some(health.drains as f64),
        Some(health.drain_errors as f64),
        secs(health.last_drain_us),
        secs(health.last_symbolize_us),
        Some(stacks as f64),
        crate::process::own::cpu_seconds(),
        crate::process::own::resident_bytes().map(|b| b as f64),
    ];
    for ((name, help), value) in DAEMON.into_iter().zip(values) {
        if let Some(value) = value {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            out.family(name, kind, help);
            out.sample(name, "", value);
        }
    }
}

/// The daemon's resident memory by kind and the size of what it holds.
pub(super) fn memory_series(out: &mut Out, store: &StoreStats, health: &Health) {
    if let Some(rss) = Rss::of_self() {
        let name = "wallscope_daemon_rss_bytes";
        out.family(
            name,
            "gauge",
            "Resident memory of the daemon by kind (RssAnon, RssFile, RssShmem)",
        );
        for (kind, v) in [
            ("anon", rss.anon_bytes),
            ("file", rss.file_bytes),
            ("shmem", rss.shmem_bytes),
        ] {
            out.sample(name, &label("kind", kind), v);
        }
    }
    let name = "wallscope_held_bytes";
    let help = "Estimated bytes the daemon holds, by table (store slices, stacks and live view, the bound on them, symbolizer frame names)";
    out.family(name, "gauge", help);
    for (what, v) in [
        ("store_slices", store.slice_bytes),
        ("store_stacks", store.stack_bytes),
        ("store_live", store.live_bytes),
        ("store_max", store.max_bytes),
        ("frame_names", health.frame_name_bytes as usize),
    ] {
        out.sample(name, &label("what", what), v);
    }
    let name = "wallscope_held_entries";
    out.family(name, "gauge", "Entries the daemon holds, by table");
    for (what, v) in [
        ("store_slices", store.slices as u64),
        ("store_process_totals", store.process_totals as u64),
        ("store_live_threads", store.live_threads as u64),
        ("elf_files_open", health.elf_files_open),
    ] {
        out.sample(name, &label("what", what), v);
    }
    let name = "wallscope_store_history_seconds";
    out.family(
        name,
        "gauge",
        "History the store holds (the retention, older parts merged in time; below it when its memory bound evicted slices)",
    );
    out.sample(name, "", store.history_s);
    let name = "wallscope_store_evicted_total";
    let help = "Slices and their stack rows dropped, oldest first, to keep the store within --max-memory-mb";
    out.family(name, "counter", help);
    out.sample(name, &label("what", "slices"), store.evicted_slices);
    out.sample(name, &label("what", "rows"), store.evicted_rows);
    let name = "wallscope_store_compacted_total";
    let help =
        "Slices merged into coarser ones (10 s, 60 s) to keep the retention within --max-memory-mb";
    out.family(name, "counter", help);
    out.sample(name, "", store.compacted_slices);
    let name = "wallscope_store_folded_slices";
    let help = "Slices held whose stack rows are folded into per-pool rows";
    out.family(name, "gauge", help);
    out.sample(name, "", store.folded_slices as u64);
    let name = "wallscope_store_folded_parts_total";
    let help = "Parts of slices (the rows and thread totals of the process holding the most) folded into per-pool ones to keep within --max-memory-mb";
    out.family(name, "counter", help);
    out.sample(name, "", store.folded_parts);
}

/// The disk history's size and what it lost (nothing without one).
pub(super) fn history_series(out: &mut Out, history: &HistoryState) {
    let HistoryState::On {
        stats,
        encoder_dropped,
    } = history
    else {
        return;
    };
    let gauges = [
        (
            "wallscope_history_disk_bytes",
            "Bytes the disk history holds (--history-disk-mb bounds them)",
            stats.bytes,
        ),
        (
            "wallscope_history_disk_seconds",
            "Seconds of history held on disk",
            stats.seconds,
        ),
        (
            "wallscope_history_degraded",
            "1 while writing the disk history fails (see /healthz history.degraded)",
            u64::from(stats.degraded.is_some()),
        ),
    ];
    for (name, help, v) in gauges {
        out.family(name, "gauge", help);
        out.sample(name, "", v);
    }
    let name = "wallscope_history_disk_errors_total";
    let help = "Disk history failures: writes that failed, torn blocks skipped at open, reads that failed, blocks dropped (writer or encoder behind)";
    out.family(name, "counter", help);
    for (what, v) in [
        ("write", stats.write_errors),
        ("torn", stats.torn_blocks),
        ("read", stats.read_errors),
        ("dropped", stats.dropped_blocks + encoder_dropped),
    ] {
        out.sample(name, &label("what", what), v);
    }
}

/// The spans' store: what it holds and what its bound dropped.
pub(super) fn spans_series(out: &mut Out, spans: &SpanStats) {
    let name = "wallscope_spans_held";
    let help = "Spans known by id, and buckets (one per drain) of span times and stacks, in the spans' store";
    out.family(name, "gauge", help);
    out.sample(name, &label("what", "spans"), spans.spans as u64);
    out.sample(name, &label("what", "buckets"), spans.buckets as u64);
    let name = "wallscope_spans_dropped_total";
    let help = "Span data dropped to keep the spans' store within its part of --memory-mb: spans aggregated by attributes (ids and stacks dropped), their rows, rows refused, attribute sets counted as (others)";
    out.family(name, "counter", help);
    for (what, v) in [
        ("aggregated_spans", spans.aggregated_spans),
        ("aggregated_rows", spans.aggregated_rows),
        ("refused_rows", spans.refused_rows),
        ("others_rows", spans.others_rows),
    ] {
        out.sample(name, &label("what", what), v);
    }
}

/// What each holder holds and its bound (`/healthz` `memory.holders`).
pub(super) fn holder_series(
    out: &mut Out,
    (store, spans): (&StoreStats, &SpanStats),
    queries: &QueryStats,
    sinks: &[PushReport],
) {
    let Some(memory) = crate::api::memory::report(store, spans, queries, sinks) else {
        return;
    };
    let name = "wallscope_memory_holder_bytes";
    out.family(name, "gauge", "Bytes each of the daemon's holders holds");
    for h in &memory.holders {
        out.sample(name, &label("holder", h.name), h.bytes);
    }
    let name = "wallscope_memory_holder_bound_bytes";
    out.family(name, "gauge", "The byte bound enforced on each holder");
    for h in &memory.holders {
        if let Some(bound) = h.bound {
            out.sample(name, &label("holder", h.name), bound);
        }
    }
    let name = "wallscope_memory_budget_bytes";
    out.family(name, "gauge", "The daemon's memory budget (--memory-mb)");
    out.sample(name, "", memory.budget.budget_bytes);
    let name = "wallscope_memory_budget_part_bytes";
    let help = "Each part of the memory budget, which bounds its holder";
    out.family(name, "gauge", help);
    for s in &memory.budget.split {
        out.sample(name, &label("part", s.part.name()), s.bytes);
    }
}

/// The bound on concurrent queries.
pub(super) fn query_series(out: &mut Out, q: &QueryStats) {
    let name = "wallscope_queries";
    out.family(name, "gauge", "Store queries running or waiting for a turn");
    out.sample(name, &label("state", "running"), q.running);
    out.sample(name, &label("state", "waiting"), q.waiting);
    let name = "wallscope_queries_total";
    out.family(
        name,
        "counter",
        "Store queries completed, and refused with 503 (too many waiting, or no turn in time)",
    );
    out.sample(name, &label("outcome", "completed"), q.completed);
    out.sample(name, &label("outcome", "refused"), q.refused);
}

/// The HTTP server's connection gauge and event counters.
pub(super) fn http_series(out: &mut Out) {
    let http = crate::api::server::stats::STATS.snapshot();
    let name = "wallscope_http_connections_open";
    out.family(name, "gauge", "Open HTTP connections");
    out.sample(name, "", http.connections_open);
    let name = "wallscope_http_events_total";
    let help = "HTTP connections accepted, closed (idle_timeout, evicted, write_stalled: an answer not taken), refused (full) and requests rejected (host, token) since start";
    out.family(name, "counter", help);
    for (event, n) in http.events() {
        out.sample(name, &label("event", event), n);
    }
    let answers = crate::api::answers::BUDGET.stats();
    let name = "wallscope_http_answer_bytes";
    let help = "Bytes of HTTP answers being written (held), and the answer budget";
    out.family(name, "gauge", help);
    out.sample(name, &label("state", "held"), answers.held);
    out.sample(name, &label("state", "budget"), answers.limits.total);
    let name = "wallscope_http_answers_total";
    let help = "HTTP answers charged to the answer budget, and requests refused with 503 past it";
    out.family(name, "counter", help);
    out.sample(name, &label("outcome", "charged"), answers.answers);
    out.sample(name, &label("outcome", "refused"), answers.refused);
}

/// A push sink's counters: `wallscope_push_*` for Pyroscope
/// (`--push-url`), `wallscope_otlp_*` for OTLP (`--otlp-url`).
pub(super) fn push_series(out: &mut Out, r: &PushReport) {
    let (sink, server) = match r.sink {
        "otlp" => ("otlp", "the OTLP receiver"),
        _ => ("push", "Pyroscope"),
    };
    let name = format!("wallscope_{sink}_requests_total");
    let help = format!("Requests to {server} (several processes each): sent, and failed tries by reason (timeout, refused, http_4xx, http_5xx)");
    out.family(&name, "counter", &help);
    out.sample(&name, &label("outcome", "sent"), r.sent_requests);
    for &f in Failure::ALL {
        out.sample(&name, &label("outcome", f.name()), r.failed.get(f));
    }
    let name = format!("wallscope_{sink}_profiles_total");
    let help = format!("Profiles pushed to {server}, refused as invalid (4xx but 429), and dropped unsent from the full queue");
    out.family(&name, "counter", &help);
    for (outcome, n) in [
        ("sent", r.sent_profiles),
        ("rejected", r.rejected_profiles),
        ("dropped", r.dropped_profiles),
    ] {
        out.sample(&name, &label("outcome", outcome), n);
    }
    let name = format!("wallscope_{sink}_trimmed_samples_total");
    let help = format!("Samples merged into [trimmed] to fit the limits of {server}");
    out.family(&name, "counter", &help);
    out.sample(&name, "", r.trimmed_samples);
    let name = format!("wallscope_{sink}_queued_bytes");
    out.family(
        &name,
        "gauge",
        &format!("Bytes of requests waiting to be pushed to {server}"),
    );
    out.sample(&name, "", r.queued_bytes);
    if let Some(t) = r.last_success_unix {
        let name = format!("wallscope_{sink}_last_success_timestamp_seconds");
        out.family(
            &name,
            "gauge",
            &format!("When a push to {server} last succeeded (Unix time)"),
        );
        out.sample(&name, "", t);
    }
}
