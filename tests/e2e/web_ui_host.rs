//! The host page as a new user opens it during an incident (issue #31): a
//! CPU-bound process, a process starved in the runqueue and a process with
//! a thread blocked on a lock for 30 s lead the default view; kernel
//! threads are folded; the summary line counts CPUs and the blocked
//! thread; no two column headers are alike.
//!
//! With `WALLSCOPE_SCREENSHOT=PATH` it also saves the page's top to PATH
//! before checking anything (with `WALLSCOPE_E2E_BIN` naming an older
//! build, that is docs/web-ui.md's "before" picture).

use std::{io::BufRead, path::PathBuf, time::Duration};

use crate::support::{
    browser::Browser,
    rows::{json_at, within},
    *,
};
use crate::web_ui::{artifact, online_cpus, LOAD};

/// Starts `hung SECONDS 1`: one waiter on the lock; returns once every
/// thread is in place.
fn start_hung(seconds: &str) -> Workload {
    let mut w = Workload::start(&workload("hung"), &[seconds, "1"]);
    let out = w.stdout();
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "hung ended early");
        if line.trim() == "placed" {
            return w;
        }
    }
}

#[test]
fn the_host_page_leads_with_busy_starved_and_blocked_processes() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let Some(mut b) = Browser::launch_or_skip() else {
        return;
    };
    let ws = Daemon::start(&[]);
    // Four threads each: always runnable, so on a busy host too they
    // outweigh any one-thread loop, on the CPU or waiting for it.
    let busy = Workload::start(&workload("cpu_shares"), &["90", "4"]);
    let starve = Workload::start(&workload("starve"), &["4", "90", "0"]);
    let hung = start_hung("90");
    // The waiter has waited 30 s on the lock (as `/blocked` sees it).
    let blocked = format!("/blocked?pid={}&min_seconds=30", hung.pid);
    within(Duration::from_secs(60), || {
        let v = json_at(&ws.url, &blocked);
        let waits = v["threads"]
            .as_array()?
            .iter()
            .any(|t| t["state"] == "futex");
        waits.then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "no thread of hung blocked 30 s: {}",
            json_at(&ws.url, &blocked)
        )
    });

    b.goto(&format!("{}/", ws.url));
    b.wait_for(
        "the host page",
        "document.getElementById('processes').dataset.state === 'ready' && document.getElementById('host').dataset.state === 'ready'",
        LOAD,
    );
    b.screenshot(&artifact("host-page"));
    if let Some(path) = std::env::var_os("WALLSCOPE_SCREENSHOT") {
        // The top of the page: the summary and the first rows.
        b.eval("document.querySelectorAll('#processes-table tbody tr').forEach((r, i) => { if (i >= 18) r.style.display = 'none'; }); 1");
        b.screenshot(&PathBuf::from(path));
        b.eval("document.querySelectorAll('#processes-table tbody tr').forEach(r => { r.style.display = ''; }); 1");
    }

    let rows = b.eval(
        "[...document.querySelectorAll('#processes-table tbody tr')].map(r => ({pid: r.dataset.pid, kernel: r.dataset.kernel, folded: r.dataset.folded, strip: r.querySelector('.strip').dataset.strip || '', text: r.textContent}))",
    );
    let rows = rows.as_array().unwrap();
    let position = |pid: u32| {
        rows.iter()
            .position(|r| r["pid"].as_str().and_then(|p| p.parse().ok()) == Some(pid))
    };
    let summary: Vec<String> = rows
        .iter()
        .take(10)
        .map(|r| r["text"].to_string())
        .collect();
    for (name, pid) in [
        ("cpu_shares", busy.pid),
        ("starve", starve.pid),
        ("hung", hung.pid),
    ] {
        let at = position(pid);
        assert!(
            at.is_some_and(|at| at < 5),
            "{name} ({pid}) at row {at:?}, not in the first five: {summary:#?}"
        );
    }
    assert!(
        rows.iter().take(10).all(|r| r["kernel"] != "1"),
        "a kernel thread in the first ten rows: {summary:#?}"
    );
    let folded = rows.iter().find(|r| r["folded"].is_string());
    assert!(
        folded.is_some_and(|r| r["text"].as_str().unwrap().contains("[kernel threads]")),
        "no [kernel threads] row"
    );
    // Each strip has a mark per stretch; the spinning ones run or wait to.
    for pid in [busy.pid, starve.pid] {
        let strip = rows[position(pid).unwrap()]["strip"].as_str().unwrap();
        assert_eq!(strip.len(), 30, "{strip}");
        assert!(strip.contains('c') || strip.contains('r'), "{pid}: {strip}");
    }

    let online = online_cpus();
    let line = b.eval("document.getElementById('host-summary').textContent");
    let line = line.as_str().unwrap();
    assert!(line.starts_with(&format!("{online} CPUs · ")), "{line}");
    // hung's one held thread; another process on the host may have one
    // too (the count is the host's), so the line's number is read, and
    // hung's share checked in /host's list behind it.
    let held: u64 = line
        .split(" · ")
        .find_map(|part| part.strip_suffix(" blocked > 10 s now"))
        .and_then(|n| n.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no blocked count in {line}"));
    assert!(held >= 1, "{line}");
    let stuck = json_at(&ws.url, "/host")["stuck"].clone();
    let hung_held = stuck["processes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pid"] == hung.pid))
        .map(|p| p["threads"].clone());
    assert_eq!(hung_held, Some(1.into()), "{stuck}");
    let link = b.eval("document.getElementById('held-up').getAttribute('href')");
    assert_eq!(link, "/blocked?min_seconds=10&format=text");

    let headers =
        b.eval("[...document.querySelectorAll('#processes-table th')].map(h => h.textContent)");
    let headers: Vec<&str> = headers
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    let mut unique = headers.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), headers.len(), "{headers:?}");
    assert!(
        headers.iter().any(|h| h.contains("last 30 s")),
        "the window is not in the headers: {headers:?}"
    );
    let status = b.eval("document.getElementById('processes-status').textContent");
    assert!(status.as_str().unwrap().contains("as of "), "{status}");

    // Unfolded on a click, and shown as rows of their own when asked.
    let kernel_rows = "document.querySelectorAll('#processes-table tr[data-kernel=\"1\"]').length";
    assert_eq!(b.eval(kernel_rows), 0);
    b.eval("document.querySelector('#processes-table button.fold').click(); 1");
    let opened = b.eval(kernel_rows);
    assert!(opened.as_u64() > Some(0), "{opened}");
    b.eval("(() => { const e = document.getElementById('kernel-threads'); e.checked = true; e.dispatchEvent(new Event('change')); return 1; })()");
    assert_eq!(
        b.eval("document.querySelectorAll('#processes-table tr[data-folded]').length"),
        0
    );
    assert_eq!(b.eval(kernel_rows), opened);
    assert!(b
        .eval("location.search")
        .as_str()
        .unwrap()
        .contains("kthreads=1"));
    assert_eq!(b.console_errors(), Vec::<String>::new());
    drop((busy, starve, hung));
}
