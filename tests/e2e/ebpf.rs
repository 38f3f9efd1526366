//! End-to-end tests with the real BPF programs: they need root, and under
//! CI=true they fail rather than skip without it. Each runs a real workload
//! and asserts on what the daemon reports over HTTP. One at a time: each
//! `record` loads its own programs and reads the whole host, which would
//! make the shared daemon lag behind the others' workloads.

use std::time::Duration;

use crate::support::*;

#[test]
fn cpu_shares_match_the_workload_and_stacks_reach_main() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    // Four seconds of CPU (400 samples), however long the host takes to
    // give them: the shares below are then within sampling error.
    let (pid, out) = run_with_output("cpu_shares", &["4", "1", "cpu"]);
    let (rows, body) = folded_rows(&format!("pid={pid}&seconds=300"));
    // However much CPU the host left the workload, the samples add up to
    // what the kernel counted, within sampling error (99 Hz ticks shared
    // with whatever else runs: off by about the square root of their
    // count; three times that allowed).
    let total_us = rows.iter().map(|r| r.1).sum::<u64>() as f64;
    let kernel_us: f64 = kernel::accounts(&out).values().map(|k| k.cpu_us).sum();
    let period_us = 1e6 / 99.0;
    let error_us = 0.05 * kernel_us + 3.0 * (kernel_us / period_us).sqrt() * period_us;
    assert!(
        kernel_us > 0.0 && (total_us - kernel_us).abs() <= error_us,
        "samples add up to {total_us} us of CPU, the kernel counted {kernel_us} us\n{out}"
    );
    for (stack, _) in &rows {
        assert_eq!(
            stack[0], "cpu_shares",
            "root frame is the process name: {stack:?}"
        );
    }
    for (frame, expected) in [("heavy", 0.6), ("medium", 0.3), ("light", 0.1)] {
        let share = share_of(&rows, frame);
        assert!(
            (share - expected).abs() <= 0.08,
            "{frame}: share {share:.3}, expected {expected} ± 0.08\n{body}"
        );
        // Stacks run from main down to the leaf function.
        let complete = rows
            .iter()
            .filter(|(s, _)| s.last().map(String::as_str) == Some(frame))
            .any(|(s, _)| s.windows(3).any(|w| w == ["main", "run", frame]));
        assert!(complete, "no stack main;run;{frame} in\n{body}");
    }
}

#[test]
fn syscall_heavy_workload_shows_kernel_frames_on_user_frames() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let pid = run("syscalls", &["4"]);
    let (rows, body) = folded_rows(&format!("pid={pid}&seconds=300"));
    let mixed: Vec<_> = rows
        .iter()
        .filter(|(s, _)| {
            // Not `read_zeroes`: glibc's read has no frame pointer, so the
            // walk skips its caller's frame (issue 5 brings table unwinding).
            let user = s.iter().position(|f| f == "copy_loop");
            let kernel = s.iter().position(|f| f.ends_with("_[k]"));
            matches!((user, kernel), (Some(u), Some(k)) if u < k)
                && s.iter()
                    .skip_while(|f| !f.ends_with("_[k]"))
                    .all(|f| f.ends_with("_[k]"))
        })
        .collect();
    assert!(
        !mixed.is_empty(),
        "no stack with kernel frames above copy_loop:\n{body}"
    );
    assert!(
        share_of(&rows, "copy_loop") > 0.8,
        "user frames under most samples:\n{body}"
    );
}

#[test]
fn exited_process_still_symbolizes() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    settle(url);
    // The daemon names frames from the maps it read while the process
    // lived: a busy host may delay that past a short life, so the
    // workload runs until its stacks were named once, then is killed.
    let w = Workload::start(&workload("cpu_shares"), &["600"]);
    let pid = w.pid;
    let seen = rows::within(CATCH_UP, || {
        let rows = rows::folded_at(url, &format!("pid={pid}&seconds=300"));
        (share_of(&rows, "heavy") > 0.0).then_some(())
    });
    assert!(seen.is_some(), "no named stack of pid {pid} while it ran");
    w.stop();
    settle(url);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "workload should be gone"
    );

    let (status, body) = get(&format!("{url}/folded?pid={pid}&seconds=300"));
    assert_eq!(status, 200, "{body}");
    let rows = parse_folded(&body);
    assert!(
        share_of(&rows, "heavy") > 0.4,
        "frames of the exited process are named:\n{body}"
    );
    assert!(
        body.contains("cpu_shares;") && body.contains(";main;run;heavy "),
        "{body}"
    );
    let (status, svg) = get(&format!("{url}/flamegraph?pid={pid}&seconds=300"));
    assert_eq!(status, 200);
    assert!(
        svg.contains("cpu_shares (pid ") && svg.contains("heavy"),
        "title names the process"
    );
}

#[test]
fn healthz_reports_attached_programs_and_samples() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = daemon();
    // A drain a second; a busy host may delay the first one.
    let drained = |v: &serde_json::Value| v["pipeline"]["drains"].as_u64() >= Some(1);
    let v = rows::within(Duration::from_secs(30), || {
        Some(rows::json_at(url, "/healthz")).filter(drained)
    });
    let v = v.unwrap_or_else(|| rows::json_at(url, "/healthz"));
    let body = v.to_string();
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(v["programs"][0]["name"], "on_cpu_sample");
    assert_eq!(v["programs"][0]["links"].as_u64(), Some(cpus), "{body}");
    assert!(v["pipeline"]["drains"].as_u64().unwrap() >= 1, "{body}");
    assert!(v["lost"]["counts_map_full"].is_u64(), "{body}");
    // The kernels the tests run on take every program: one the verifier
    // refuses (a frame grown past its stack bound) is only a warning at
    // run time, and would otherwise go unnoticed.
    let attached: Vec<&str> = v["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for program in [
        "on_switch",
        "on_waking",
        "on_wakeup",
        "on_wakeup_new",
        "on_fork",
        "on_exec",
        "on_exit",
        "on_rename",
        "on_switched_in",
        "live_threads",
    ] {
        assert!(
            attached.contains(&program),
            "{program} not attached: {body}"
        );
    }
}

#[test]
fn record_writes_svg_and_folded_files() {
    let Some(_fx) = Fixture::ebpf_serial() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Runs until dropped: however slowly a busy host loads the programs
    // for each record, the workload is still there to be sampled.
    let w = Workload::start(&workload("cpu_shares"), &["600"]);
    for name in ["out.svg", "out.folded"] {
        let path = dir.path().join(name);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wallscope"))
            .args([
                "record",
                "--pid",
                &w.pid.to_string(),
                "--duration",
                "5s",
                "-o",
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "record failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&path).unwrap();
        if name.ends_with(".svg") {
            assert!(
                text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"),
                "not an SVG"
            );
            assert!(text.contains("heavy") && text.contains(&format!("pid {}", w.pid)));
        } else {
            let rows = parse_folded(&text);
            assert!(rows.iter().all(|(s, _)| s[0] == "cpu_shares"));
            assert!(share_of(&rows, "heavy") > 0.4, "{text}");
        }
    }
}
