//! The web UI in a real browser (Debian's `chromium`, headless, driven over
//! the DevTools protocol by `support::browser`) against a daemon profiling
//! the mixed and starvation workloads. Root and eBPF as for every
//! end-to-end test; screenshots go to `target/ui-artifacts/`.

use std::{path::PathBuf, thread, time::Duration};

use crate::support::{browser::Browser, *};
use serde_json::Value;

pub(crate) const LOAD: Duration = Duration::from_secs(60);

pub(crate) fn artifact(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/ui-artifacts/{name}.png"))
}

/// CPUs online, as the kernel's account lists them.
pub(crate) fn online_cpus() -> usize {
    std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count()
}

/// Waits until the process page has loaded every panel (again, after
/// `since`, the previous load's mark).
fn loaded(b: &mut Browser, since: &Value) -> Value {
    let js = format!(
        "document.body.dataset.loaded && document.body.dataset.loaded !== {} && document.body.dataset.loaded",
        serde_json::to_string(&since.as_str().unwrap_or("")).unwrap()
    );
    b.wait_for("the process page's panels", &js, LOAD)
}

fn panel_states(b: &mut Browser) -> Value {
    b.eval(
        "Object.fromEntries([...document.querySelectorAll('section.panel')].map(s => [s.id, s.dataset.state]))",
    )
}

fn text(b: &mut Browser, selector: &str) -> String {
    let js = format!("document.querySelector({selector:?}).textContent");
    b.eval(&js).as_str().unwrap_or("").to_string()
}

/// Sets a control's value and fires the event the page listens to.
fn set(b: &mut Browser, id: &str, value: &str, event: &str) {
    b.eval(&format!(
        "(() => {{ const e = document.getElementById({id:?}); e.value = {value:?}; e.dispatchEvent(new Event({event:?})); return 1; }})()"
    ));
}

/// The state a thread of the mixed workload must mostly be in, by name.
fn expected_state(name: &str) -> &'static [&'static str] {
    match name {
        n if n.starts_with("lock-") => &["futex"],
        "sleeper" | "reader" => &["sleep"],
        // CPU-bound: on a busy host it may wait for a CPU more than it runs.
        "spinner" => &["cpu", "runqueue"],
        _ => &["cpu", "runqueue", "futex", "io", "sleep", "throttled"],
    }
}

#[test]
fn the_pages_show_threads_timeline_flame_graph_and_runqueue() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let Some(mut b) = Browser::launch_or_skip() else {
        return;
    };
    let ws = Daemon::start(&[]);
    let mixed = Workload::start(&workload("mixed"), &["40"]);
    let cpus = "0";
    let starve = Workload::start(&workload("starve"), &["4", "40", cpus]);
    thread::sleep(Duration::from_secs(8));
    settle(&ws.url);

    // The host page lists both, and its search finds one by name.
    b.goto(&format!("{}/?seconds=60&sort=wall", ws.url));
    b.wait_for(
        "the host page",
        "document.getElementById('processes').dataset.state === 'ready'",
        LOAD,
    );
    let pids = b.eval(
        "[...document.querySelectorAll('#processes-table tr[data-pid]')].map(r => Number(r.dataset.pid))",
    );
    for pid in [mixed.pid, starve.pid] {
        assert!(
            pids.as_array().unwrap().contains(&pid.into()),
            "{pid} not in {pids}"
        );
    }
    // The summary line has the kernel's CPU count, and the threads pinned
    // four to a CPU lead the processes that waited for one, kept off it
    // by each other.
    let online = online_cpus();
    let summary = b.wait_for(
        "the host summary",
        "document.getElementById('host').dataset.state === 'ready' && [document.getElementById('host-summary').dataset.cpus, document.getElementById('host-summary').textContent]",
        LOAD,
    );
    assert_eq!(summary[0], online.to_string(), "{summary}");
    assert!(
        summary[1]
            .as_str()
            .unwrap()
            .starts_with(&format!("{online} CPUs · ")),
        "{summary}"
    );
    let starved = b.eval(
        "[...document.querySelectorAll('#starved-table tr[data-pid]')].map(r => [Number(r.dataset.pid), JSON.parse(r.dataset.culprits)])",
    );
    assert!(
        starved
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r[0] == starve.pid && r[1].as_array().unwrap().contains(&"starve".into())),
        "the starved workload {} and its culprits not listed: {starved}",
        starve.pid
    );
    b.screenshot(&artifact("host"));
    set(&mut b, "search", "starve", "input");
    let shown = b.eval(
        "[...document.querySelectorAll('#processes-table tr[data-pid]')].map(r => Number(r.dataset.pid))",
    );
    assert!(
        shown.as_array().unwrap().contains(&starve.pid.into()),
        "{shown}"
    );
    assert!(
        !shown.as_array().unwrap().contains(&mixed.pid.into()),
        "{shown}"
    );
    // Grouped by name, as `/processes?group=comm` sums them.
    set(&mut b, "search", "", "input");
    set(&mut b, "group", "comm", "change");
    let groups = b.wait_for(
        "the host page grouped by name",
        "(() => { const r = [...document.querySelectorAll('#processes-table tr[data-group]')]; return r.length > 0 && r.map(r => [r.dataset.group, Number(r.dataset.processes)]); })()",
        LOAD,
    );
    assert!(
        groups
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g[0] == "starve" && g[1].as_u64() >= Some(1)),
        "{groups}"
    );
    b.screenshot(&artifact("host-grouped"));
    set(&mut b, "group", "", "change");

    // The mixed workload's page: every thread, with its dominant state.
    b.goto(&format!("{}/process/{}?seconds=60", ws.url, mixed.pid));
    let mark = loaded(&mut b, &Value::Null);
    let states = panel_states(&mut b);
    for (panel, state) in states.as_object().unwrap() {
        assert_eq!(state, "ready", "panel {panel}: {states}");
    }
    let (status, body) = get(&format!("{}/threads?pid={}&seconds=60", ws.url, mixed.pid));
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    let rows = b.eval(
        "[...document.querySelectorAll('#threads-table tr[data-tid]')].map(r => [Number(r.dataset.tid), r.dataset.dominant, r.dataset.wokenBy])",
    );
    // The sleeper's naps end by a timer; the reader's by the main thread.
    let woken = |name: &str| {
        let tid = report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {report}"))["tid"]
            .clone();
        let row = rows.as_array().unwrap().iter().find(|r| r[0] == tid);
        row.and_then(|r| r[2].as_str()).unwrap_or("").to_string()
    };
    assert!(woken("sleeper").starts_with("[timer] "), "{rows}");
    assert!(
        woken("reader").starts_with(&format!("mixed (tid {}) ", mixed.pid)),
        "{rows}"
    );
    let timeline = b.eval(
        "[...document.querySelectorAll('#timeline-labels div[data-tid]')].map(r => Number(r.dataset.tid))",
    );
    for t in report["threads"].as_array().unwrap() {
        let (tid, name) = (&t["tid"], t["name"].as_str().unwrap());
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == *tid)
            .unwrap_or_else(|| panic!("thread {name} ({tid}) not in the table: {rows}"));
        let dominant = row[1].as_str().unwrap();
        assert!(
            expected_state(name).contains(&dominant),
            "{name}: mostly {dominant} on the page: {t}"
        );
        assert!(
            timeline.as_array().unwrap().contains(tid),
            "no timeline row for {name}: {timeline}"
        );
    }
    for name in ["lock-1", "sleeper", "reader", "spinner"] {
        assert!(body.contains(name), "{name} missing from /threads: {body}");
    }
    let hist_bars = b.eval("document.querySelectorAll('#runqueue-hist .hist > div').length");
    assert!(hist_bars.as_u64().unwrap() > 0, "no histogram bars");
    let figures = text(&mut b, "#runqueue-figures");
    for p in ["p50", "p90", "p99"] {
        assert!(figures.contains(p), "{figures}");
    }
    b.screenshot(&artifact("process-mixed"));

    // Search finds the lock's frame in the wall graph.
    set(&mut b, "flame-search", "contend_on_mutex", "input");
    let matched = b.wait_for(
        "search results",
        "Number(document.getElementById('flame').dataset.matched) > 0 && document.getElementById('flame').dataset.matched",
        LOAD,
    );
    let total: f64 = b
        .eval("Number(document.getElementById('flame').dataset.total)")
        .as_f64()
        .unwrap();
    let share = matched.as_str().unwrap().parse::<f64>().unwrap() / total;
    assert!(
        share > 0.05,
        "contend_on_mutex holds {share:.3} of the wall graph"
    );
    b.screenshot(&artifact("flame-search"));

    // Another kind draws another graph, and says so in the URL.
    set(&mut b, "kind", "cpu", "change");
    b.wait_for(
        "the CPU graph",
        "document.getElementById('flame').dataset.kind === 'cpu' && document.getElementById('flame').dataset.state === 'ready'",
        LOAD,
    );
    let cpu_total = b
        .eval("Number(document.getElementById('flame').dataset.total)")
        .as_f64()
        .unwrap();
    assert!(
        cpu_total > 0.0 && cpu_total < total,
        "cpu {cpu_total} vs wall {total}"
    );
    assert!(b
        .eval("location.search")
        .as_str()
        .unwrap()
        .contains("kind=cpu"));

    // A range dragged on the timeline scopes every panel to it.
    let before = b
        .eval("Number(document.getElementById('timeline').dataset.columns)")
        .as_u64()
        .unwrap();
    assert!(before >= 4, "{before} timeline columns");
    b.eval(
        "(() => { const c = document.getElementById('timeline-canvas'); const r = c.getBoundingClientRect();
           const at = (x) => ({ clientX: r.left + x, clientY: r.top + 3, bubbles: true });
           c.dispatchEvent(new MouseEvent('mousedown', at(r.width * 0.5)));
           c.dispatchEvent(new MouseEvent('mouseup', at(r.width * 0.75)));
           return 1; })()",
    );
    let mark = loaded(&mut b, &mark);
    let url = b.eval("location.href").as_str().unwrap().to_string();
    assert!(url.contains("from=") && url.contains("until="), "{url}");
    let after = b
        .eval("Number(document.getElementById('timeline').dataset.columns)")
        .as_u64()
        .unwrap();
    assert!(
        after < before,
        "timeline columns {before} -> {after} after choosing a range"
    );
    let scoped_total = b
        .eval("Number(document.getElementById('flame').dataset.total)")
        .as_f64()
        .unwrap();
    assert!(
        scoped_total < cpu_total,
        "cpu graph {cpu_total} -> {scoped_total} in the range"
    );
    b.screenshot(&artifact("range"));

    // The link, pasted, opens the same view.
    let view = "JSON.stringify([document.getElementById('flame').dataset.kind, document.getElementById('flame').dataset.total,
        document.getElementById('timeline').dataset.rows, document.getElementById('flame-search').value])";
    let seen = b.eval(view);
    b.goto("about:blank");
    b.goto(&url);
    loaded(&mut b, &mark);
    assert_eq!(b.eval(view), seen, "{url}");

    // The starved process: its crunchers mostly wait for a CPU.
    b.goto(&format!(
        "{}/process/{}?seconds=60&tgroup=pool",
        ws.url, starve.pid
    ));
    loaded(&mut b, &Value::Null);
    let pools = b.eval(
        "[...document.querySelectorAll('#threads-table tbody tr')].map(r => [r.cells[0].textContent, r.dataset.dominant])",
    );
    let crunchers = pools
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p[0].as_str().unwrap().starts_with("cruncher"))
        .unwrap_or_else(|| panic!("no cruncher pool: {pools}"));
    assert_eq!(crunchers[1], "runqueue", "{pools}");
    let count = b.eval("Number(document.getElementById('runqueue').dataset.count)");
    assert!(count.as_u64().unwrap() > 0, "{count}");
    b.screenshot(&artifact("process-starve"));

    let errors = b.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    drop((mixed, starve));
}

#[test]
fn a_failing_panel_leaves_the_others_working() {
    let Some(_fx) = Fixture::ebpf() else {
        return;
    };
    let Some(mut b) = Browser::launch_or_skip() else {
        return;
    };
    let ws = Daemon::start(&[]);
    let mixed = Workload::start(&workload("mixed"), &["30"]);
    thread::sleep(Duration::from_secs(5));
    settle(&ws.url);
    b.goto(&format!("{}/process/{}?seconds=60", ws.url, mixed.pid));
    let mark = loaded(&mut b, &Value::Null);
    // The flame graph's code throws, and the runqueue's answer fails.
    b.eval(
        "Flame.draw = () => { throw new TypeError('injected failure'); };
         window.fetch = ((f) => (u, o) => String(u).startsWith('/runqueue')
           ? Promise.reject(new TypeError('injected network failure')) : f(u, o))(window.fetch); 1",
    );
    set(&mut b, "window", "30", "change");
    loaded(&mut b, &mark);
    let states = panel_states(&mut b);
    assert_eq!(states["flame"], "error", "{states}");
    assert_eq!(states["runqueue"], "error", "{states}");
    for panel in ["summary", "threads", "timeline", "blocked", "export"] {
        assert_eq!(states[panel], "ready", "{panel}: {states}");
    }
    assert!(text(&mut b, "#flame .panel-error").contains("injected failure"));
    let rows = b.eval("document.querySelectorAll('#threads-table tr[data-tid]').length");
    assert!(rows.as_u64().unwrap() >= 6, "{rows}");
    b.screenshot(&artifact("failing-panel"));
    let errors = b.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    drop(mixed);
}
