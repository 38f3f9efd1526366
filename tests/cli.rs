//! The command line's handling of bad input: no root needed, nothing loads.

use std::process::Command;

fn wallscope(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wallscope"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn record_rejects_unknown_output_type() {
    let (code, err) = wallscope(&["record", "--pid", "1", "-o", "out.png"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(".svg or .folded"), "{err}");
}

#[test]
fn record_rejects_missing_process() {
    let (code, err) = wallscope(&["record", "--pid", "4000000", "-o", "x.svg"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no process with pid 4000000"), "{err}");
}

#[test]
fn bad_flags_are_usage_errors() {
    let (code, err) = wallscope(&["serve", "--frequency", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--frequency"), "{err}");
    let (code, err) = wallscope(&["record", "--pid", "1", "--duration", "soon", "-o", "x.svg"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--duration"), "{err}");
    let (code, err) = wallscope(&["serve", "--jvm", "sometimes"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--jvm") && err.contains("auto") && err.contains("off"),
        "{err}"
    );
}

#[test]
fn serve_reports_a_taken_port() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = wallscope(&["serve", "--listen", &addr]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on {addr}")) && err.contains("in use"),
        "{err}"
    );
}
