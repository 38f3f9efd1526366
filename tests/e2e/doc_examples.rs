//! Every `curl` example of README.md and docs/*.md, run against the live
//! daemon with a workload's pid for `PID` (its name for `SERVICE`): each
//! must answer the documented status with the documented shape
//! (conventions: docs/http-api.md and `support::doc_examples`). The harness is tested too, on the in-process
//! API: a wrong path or a key the answer lacks is reported.

use std::{io::Read, path::Path, time::Duration};

use crate::support::{
    api,
    doc_examples::{self, json_shape, mismatch, with_placeholders, Example, Shape},
    settle, workload, Fixture, Workload,
};

/// Bound on an example's answer read by the test (a whole-host profile
/// is at most 8 MiB of folded text, a trace far less for two seconds).
const MAX_ANSWER: u64 = 64 << 20;

fn examples() -> Vec<Example> {
    doc_examples::all(Path::new(env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|errors| panic!("malformed doc examples:\n{}", errors.join("\n")))
}

/// Status and body of GET `url`, whatever the status; the body as bytes
/// (`/pprof` and `/trace` are binary).
fn fetch(url: &str) -> (u16, Vec<u8>) {
    let response = match ureq::get(url).timeout(Duration::from_secs(60)).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return (0, e.to_string().into_bytes()),
    };
    let status = response.status();
    let mut body = Vec::new();
    if let Err(e) = response
        .into_reader()
        .take(MAX_ANSWER)
        .read_to_end(&mut body)
    {
        return (0, e.to_string().into_bytes());
    }
    (status, body)
}

#[test]
fn every_documented_example_answers_as_documented() {
    // Exclusive: `/trace` records one process at a time, and the examples
    // should not meet another test's recording or its load.
    let Some(fx) = Fixture::ebpf_serial() else {
        return;
    };
    let url = fx.daemon();
    // `mixed` has threads on CPU, on a lock, asleep and reading a pipe:
    // every per-process example has something to show.
    let target = Workload::start(&workload("mixed"), &["120"]);
    settle(url);
    let examples = examples();
    assert!(
        examples.len() >= 20,
        "only {} examples found: is the extraction broken?",
        examples.len()
    );
    let failures: Vec<String> = examples
        .iter()
        .filter_map(|example| {
            let path = with_placeholders(&example.path, target.pid, "mixed");
            let (status, body) = fetch(&format!("{url}{path}"));
            mismatch(example, status, &body)
        })
        .collect();
    drop(target);
    assert!(
        failures.is_empty(),
        "{} of {} documented examples do not answer as documented:\n{}",
        failures.len(),
        examples.len(),
        failures.join("\n")
    );
}

/// The examples of a doc snippet, run on the in-process API (whose one
/// process is `GONE_PID`): what the harness reports.
async fn run_snippet(doc: &str) -> Vec<String> {
    let examples = doc_examples::extract("snippet.md", doc).expect("well-formed snippet");
    assert!(!examples.is_empty(), "no example in {doc}");
    let mut failures = Vec::new();
    for example in &examples {
        let path = with_placeholders(&example.path, api::GONE_PID, "app");
        let (status, _, body) = api::call(&path).await;
        failures.extend(mismatch(example, status, body.as_bytes()));
    }
    failures
}

#[tokio::test]
async fn the_harness_reports_a_wrong_path_and_a_missing_key() {
    let right = "```sh\ncurl -s 'localhost:7070/threads?pid=PID'\n```\n\n\
                 ```json\n{\"pid\": 1, \"threads\": [...], \"process\": {...}}\n```\n";
    assert_eq!(run_snippet(right).await, Vec::<String>::new());

    let wrong_path = "```sh\ncurl -s 'localhost:7070/thread?pid=PID'\n```\n";
    let failures = run_snippet(wrong_path).await;
    assert!(
        failures.len() == 1 && failures[0].contains("status 404"),
        "{failures:?}"
    );

    let wrong_key = right.replace("\"process\"", "\"procs\"");
    let failures = run_snippet(&wrong_key).await;
    assert!(
        failures.len() == 1 && failures[0].contains("procs"),
        "{failures:?}"
    );

    let wrong_text = "```sh\ncurl -s 'localhost:7070/threads?pid=PID&format=text'\n```\n\n\
                      ```text\nthreads of 12\n```\n";
    let failures = run_snippet(wrong_text).await;
    assert!(
        failures.len() == 1 && failures[0].contains("does not start with"),
        "{failures:?}"
    );

    let documented_400 = "<!-- doc-test: status 400 -->\n```sh\n\
                          curl -s 'localhost:7070/threads?pid=-1'\n```\n";
    assert_eq!(run_snippet(documented_400).await, Vec::<String>::new());
}

#[test]
fn marks_continuations_and_shapes_are_read() {
    let doc = "<!-- doc-test: pending -->\n```sh\ncurl -s 'localhost:7070/explain?pid=PID'\n```\n\
               ```sh\n<!-- doc-test: skip (needs a container) -->\n\
               curl -s 'localhost:7070/runqueue?container=abc'\n\
               $ curl -s \\\n   'localhost:7070/processes?sort=wall' | jq .\n```\n\n\
               ```json\n[{\"pid\": 1, \"time\": {\"cpu_us\": 0}, \"comm\": \"x\"}]\n```\n\
               <!-- doc-test: status 400 -->\n```console\ncurl 'localhost:7070/host?seconds=x' > h.json\n```\n";
    let examples = doc_examples::extract("d.md", doc).unwrap();
    let paths: Vec<(&str, u16)> = examples
        .iter()
        .map(|e| (e.path.as_str(), e.status))
        .collect();
    assert_eq!(
        paths,
        [("/processes?sort=wall", 200), ("/host?seconds=x", 400)]
    );
    assert_eq!(
        examples[0].shape,
        Shape::Json {
            list: true,
            keys: vec!["pid".into(), "time".into(), "comm".into()]
        }
    );
    assert_eq!(examples[0].place, "d.md:8");

    let unexplained = "<!-- doc-test: skip -->\n```sh\ncurl 'localhost:7070/host'\n```\n";
    let errors = doc_examples::extract("d.md", unexplained).unwrap_err();
    assert!(errors[0].contains("needs a reason"), "{errors:?}");

    let nested = "{\"owner\": {\"pid\": 1}, \"buckets\": [...], \"s\": \"a: {b}\", \"x\": 1}";
    assert_eq!(
        json_shape(nested),
        Shape::Json {
            list: false,
            keys: vec!["owner".into(), "buckets".into(), "s".into(), "x".into()]
        }
    );
}

/// The docs parse, and every endpoint the API routes has an example.
#[test]
fn every_endpoint_has_a_documented_example() {
    let examples = examples();
    let documented = |route: &str| {
        examples
            .iter()
            .any(|e| e.path == route || e.path.starts_with(&format!("{route}?")))
    };
    // Every route the router serves, read from its source, so that a new
    // endpoint without an example fails here (pages and assets aside).
    let router = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/api/mod.rs"))
        .expect("src/api/mod.rs");
    let routes: Vec<&str> = router
        .split(".route(\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|route| *route != "/" && !route.contains('{'))
        .collect();
    assert!(
        routes.len() >= 14,
        "routes read from the router: {routes:?}"
    );
    let missing: Vec<&str> = routes
        .into_iter()
        .filter(|route| !documented(route))
        .collect();
    assert!(missing.is_empty(), "no example for {missing:?}");
}
