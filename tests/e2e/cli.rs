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
    assert!(err.contains(".svg, .folded or .pb.gz"), "{err}");
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

#[test]
fn serve_refuses_a_non_loopback_address_without_a_token() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for addr in [format!("0.0.0.0:{port}"), format!("[::]:{port}")] {
        let (code, err) = wallscope(&["serve", "--listen", &addr]);
        assert_eq!(code, 2, "{addr}: {err}");
        assert!(
            err.contains(&addr)
                && err.contains("--token-file")
                && err.contains("--insecure-listen"),
            "{addr}: {err}"
        );
    }
}

/// A token file with `text` and `mode` in a fresh directory.
fn token_file(text: &str, mode: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    (dir, path)
}

#[test]
fn serve_refuses_unsafe_or_missing_token_files() {
    let (_dir, readable) = token_file("s3cret\n", 0o644);
    let (_dir2, empty) = token_file(" \n", 0o600);
    let missing = readable.with_file_name("missing");
    for (path, message) in [
        (&readable, "other users"),
        (&empty, "no token"),
        (&missing, "cannot open"),
    ] {
        let path = path.to_str().unwrap();
        // On a loopback address too: the file is checked first, before
        // anything is loaded.
        for listen in ["127.0.0.1:1", "0.0.0.0:1"] {
            let (code, err) = wallscope(&["serve", "--listen", listen, "--token-file", path]);
            assert_eq!(code, 2, "{path}: {err}");
            assert!(
                err.contains("--token-file") && err.contains(path) && err.contains(message),
                "{path}: {err}"
            );
        }
    }
}

#[test]
fn serve_rejects_a_port_in_allow_host() {
    let (code, err) = wallscope(&["serve", "--allow-host", "prof.example:7070"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--allow-host") && err.contains("not a host name"),
        "{err}"
    );
}

#[test]
fn push_flags_are_checked_before_anything_loads() {
    let url = "http://127.0.0.1:4040";
    let too_many: Vec<String> = (0..20).map(|i| format!("--push-label=l{i}=v")).collect();
    let (_dir, exposed) = token_file("s3cret\n", 0o644);
    let exposed = exposed.to_str().unwrap();
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--push-url", "ftp://host"], "only http and https"),
        (vec!["--push-url", "http://u:p@host"], "password"),
        (
            vec!["--push-url", url, "--push-interval", "500ms"],
            "1s to 10m",
        ),
        (
            vec!["--push-url", url, "--push-label", "bad-name=x"],
            "not a label name",
        ),
        (
            vec!["--push-url", url, "--push-label", "__name__=x"],
            "reserved",
        ),
        (
            vec!["--push-url", url, "--push-token-file", exposed],
            "other users",
        ),
        (vec!["--push-label", "env=x"], "--push-url"),
        // The interval, top and grace need a server to push to, either.
        (vec!["--push-interval", "2s"], "--otlp-url"),
        (vec!["--otlp-url", "ftp://host"], "only http and https"),
        (
            vec!["--otlp-url", url, "--otlp-token-file", exposed],
            "other users",
        ),
        (
            vec!["--otlp-url", url, "--push-label", "env=x"],
            "--push-url",
        ),
    ];
    let mut many = vec!["--push-url", url];
    many.extend(too_many.iter().map(String::as_str));
    cases.push((many, "give at most 19"));
    for (args, message) in cases {
        let mut all = vec!["serve", "--listen", "127.0.0.1:1"];
        all.extend(&args);
        let (code, err) = wallscope(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
    }
}
