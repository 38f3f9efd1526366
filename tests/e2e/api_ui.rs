//! The web UI's routes in-process: pages, their scripts, and bad paths.

use crate::support::api::{call, error_of};

#[tokio::test]
async fn pages_and_their_files_are_served_from_the_binary() {
    let (status, ctype, body) = call("/").await;
    assert_eq!((status, ctype.as_str()), (200, "text/html; charset=utf-8"));
    let (status, _, page) = call("/process/1234?kind=futex&seconds=60").await;
    assert_eq!(status, 200);
    // Every file the pages load is there, with its type.
    for html in [&body, &page] {
        for src in html.split(['"', '\'']).filter(|s| s.starts_with("/ui/")) {
            let (status, ctype, file) = call(src).await;
            assert_eq!(status, 200, "{src}");
            assert!(!file.is_empty(), "{src}");
            let want = if src.ends_with(".css") {
                "text/css"
            } else {
                "text/javascript"
            };
            assert!(ctype.starts_with(want), "{src}: {ctype}");
        }
    }
    // Nothing is fetched from elsewhere.
    for html in [&body, &page] {
        assert!(!html.contains("http://") && !html.contains("https://"));
    }
}

/// The names the pages offer come from the daemon, as the API parses them.
#[tokio::test]
async fn meta_lists_the_apis_names_and_the_scripts_read_it() {
    use wallscope::{
        profile::model::state::State,
        profile::{
            model::kind::{Group, Kind},
            report::processes::SortBy,
        },
    };
    let (status, ctype, body) = call("/ui/meta.json").await;
    assert_eq!(status, 200, "{body}");
    assert!(ctype.starts_with("application/json"), "{ctype}");
    let meta: serde_json::Value = serde_json::from_str(&body).unwrap();
    let list = |key: &str| -> Vec<String> {
        let values = meta[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key}: {meta}"));
        values
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let mut states = list("states");
    states.sort();
    let mut want: Vec<&str> = State::ALL.iter().map(|s| s.name()).collect();
    want.sort();
    assert_eq!(states, want);
    assert_eq!(list("kinds"), Kind::names());
    assert_eq!(list("groups"), Group::names());
    assert_eq!(list("sorts"), SortBy::names());
    // The strip's letters: one per state, each state once.
    let letters = meta["strip_letters"].as_object().unwrap();
    let mut named: Vec<&str> = letters.values().map(|v| v.as_str().unwrap()).collect();
    named.sort();
    assert_eq!(named, want);
    assert!(letters.keys().all(|k| k.len() == 1), "{letters:?}");
    for name in list("kinds") {
        let (status, _, body) = call(&format!("/folded?kind={name}&seconds=30")).await;
        assert_eq!(status, 200, "{name}: {body}");
    }
    for name in list("sorts") {
        let (status, _, body) = call(&format!("/processes?sort={name}&seconds=30")).await;
        assert_eq!(status, 200, "{name}: {body}");
    }
    // The scripts read the lists from there and keep no copy.
    let (_, _, common) = call("/ui/common.js").await;
    assert!(common.contains("/ui/meta.json"));
    for script in ["common", "host", "process"] {
        let (_, _, text) = call(&format!("/ui/{script}.js")).await;
        // Pieces of the lists the scripts used to keep.
        let copies = [
            "\"io\", \"sleep\"",
            "\"process\", \"thread\"",
            "[\"blocked\", ",
        ];
        for copy in copies {
            assert!(!text.contains(copy), "{script}.js keeps {copy}");
        }
    }
}

#[tokio::test]
async fn bad_paths_are_told_apart() {
    let (status, _, body) = call("/process/abc").await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("`pid`"), "{body}");
    let (status, _, _) = call("/process/12345678901").await;
    assert_eq!(status, 400);
    let (status, _, body) = call("/ui/../Cargo.toml").await;
    assert_eq!(status, 404, "{body}");
    let (status, _, body) = call("/ui/nope.js").await;
    assert_eq!(status, 404, "{body}");
}

/// The raw answer to GET `uri` with `accept_encoding`: its
/// Content-Encoding and bytes.
async fn raw(uri: &str, accept_encoding: Option<&str>) -> (Option<String>, Vec<u8>) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let headers: Vec<(&str, &str)> = accept_encoding
        .map(|e| ("accept-encoding", e))
        .into_iter()
        .collect();
    let res = crate::support::api::app()
        .oneshot(crate::support::api::get_with(uri, &headers))
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{uri}");
    let encoding = res
        .headers()
        .get("content-encoding")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    (encoding, bytes)
}

#[tokio::test]
async fn answers_are_gzipped_for_clients_that_ask_and_only_then() {
    use std::io::Read;
    for uri in ["/ui/process.js", "/process/1234"] {
        let (plain_encoding, plain) = raw(uri, None).await;
        assert_eq!(plain_encoding, None, "{uri}");
        let (encoding, gzipped) = raw(uri, Some("gzip, deflate, br")).await;
        assert_eq!(encoding.as_deref(), Some("gzip"), "{uri}");
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(gzipped.as_slice())
            .read_to_end(&mut unzipped)
            .unwrap();
        assert_eq!(unzipped, plain, "{uri}");
        assert!(
            gzipped.len() < plain.len() / 2,
            "{uri}: {} of {}",
            gzipped.len(),
            plain.len()
        );
    }
    // `.pb.gz` is gzipped already: not a second time.
    let (encoding, pprof) = raw("/pprof?pid=4194400&seconds=600", Some("gzip")).await;
    assert_eq!(encoding, None);
    assert_eq!(&pprof[..2], &[0x1f, 0x8b]);
}

/// The process page's "record 5 s trace" button fetches `/trace` and
/// shows the error of a daemon that cannot record (here: in-process, no
/// BPF), which answers JSON as every route does.
#[tokio::test]
async fn the_trace_button_asks_trace_and_failures_have_a_message() {
    let (_, _, page) = call("/process/1234").await;
    assert!(page.contains(r#"id="trace-record""#) && page.contains("record 5 s trace"));
    let (_, _, script) = call("/ui/process.js").await;
    assert!(script.contains("/trace?pid=${pid}&seconds=5") && script.contains("recording…"));
    let me = std::process::id();
    let (status, _, body) = call(&format!("/trace?pid={me}&seconds=5")).await;
    assert_eq!(status, 503, "{body}");
    assert!(error_of(&body).contains("no trace recorder"), "{body}");
    let (status, _, body) = call("/trace?pid=1&seconds=31").await;
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("`seconds`"), "{body}");
}
