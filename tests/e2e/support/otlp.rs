//! An OTLP/HTTP profiles receiver stand-in for the OTLP test: it takes
//! `POST /v1development/profiles` (binary protobuf), decodes the body
//! with the published opentelemetry-proto files (`tests/proto/`, compiled
//! by protox, decoded by prost-reflect: not the daemon's own structs),
//! resolves every index into the dictionary (refusing the request, 400
//! with the reason, if one is out of range or a location has no
//! `profile.frame.type`), and keeps the profiles it accepted.

use std::{
    collections::BTreeMap,
    io::{BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{Arc, Mutex, OnceLock},
    thread,
    time::Duration,
};

use prost_reflect::{
    DescriptorPool, DynamicMessage, MessageDescriptor, ReflectMessage as _, Value,
};

use super::pyroscope::read_request;

/// The request message, from the vendored proto files.
fn request_type() -> MessageDescriptor {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proto");
        protox::Compiler::new([dir])
            .unwrap()
            .open_file(
                "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
            )
            .unwrap()
            .descriptor_pool()
    });
    pool.get_message_by_name(
        "opentelemetry.proto.collector.profiles.v1development.ExportProfilesServiceRequest",
    )
    .unwrap()
}

/// A sample, its indices resolved.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Function names, leaf first, with each frame's `profile.frame.type`.
    pub frames: Vec<(String, String)>,
    pub attributes: BTreeMap<String, String>,
    pub value: i64,
}

/// A profile the receiver accepted, with its resource's attributes.
#[derive(Debug, Clone)]
pub struct Profile {
    pub resource: BTreeMap<String, String>,
    pub scope: String,
    /// `type/unit`.
    pub sample_type: String,
    pub time_unix_nano: u64,
    pub duration_nano: u64,
    pub samples: Vec<Sample>,
}

impl Profile {
    /// The sum of the samples' values.
    pub fn total(&self) -> i64 {
        self.samples.iter().map(|s| s.value).sum()
    }

    /// The window: `(from, until)` in Unix nanoseconds.
    pub fn window(&self) -> (u64, u64) {
        (
            self.time_unix_nano,
            self.time_unix_nano + self.duration_nano,
        )
    }
}

#[derive(Default)]
struct State {
    received: Vec<Profile>,
    invalid: Vec<String>,
    requests: u64,
}

/// The running receiver; it stops taking requests when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Receiver {
    /// Starts a receiver on a free loopback port.
    pub fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let weak = Arc::downgrade(&state);
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let Some(state) = weak.upgrade() else { return };
                thread::spawn(move || serve(conn, &state));
            }
        });
        Receiver { addr, state }
    }

    /// The URL to give `--otlp-url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every profile accepted so far.
    pub fn received(&self) -> Vec<Profile> {
        self.state.lock().unwrap().received.clone()
    }

    /// Why requests were refused so far.
    pub fn invalid(&self) -> Vec<String> {
        self.state.lock().unwrap().invalid.clone()
    }

    /// Requests that reached the receiver so far.
    pub fn requests(&self) -> u64 {
        self.state.lock().unwrap().requests
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>) {
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let Some((request_line, headers, body)) = read_request(&mut reader) else {
        return;
    };
    let checked = if request_line != "POST /v1development/profiles HTTP/1.1" {
        Err(format!("unexpected request {request_line}"))
    } else if headers.get("content-type").map(String::as_str) != Some("application/x-protobuf") {
        Err(format!("content type {:?}", headers.get("content-type")))
    } else {
        decode(&body)
    };
    let mut s = state.lock().unwrap();
    s.requests += 1;
    let status = match checked {
        Ok(profiles) => {
            s.received.extend(profiles);
            200
        }
        Err(reason) => {
            s.invalid.push(reason);
            400
        }
    };
    drop(s);
    // An empty ExportProfilesServiceResponse: full success.
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
}

/// A field of `m` (panics on a name the proto does not have: the test's
/// mistake, not the sender's).
fn field(m: &DynamicMessage, name: &str) -> Value {
    m.get_field_by_name(name)
        .unwrap_or_else(|| panic!("no field {name} in {}", m.descriptor().full_name()))
        .into_owned()
}

fn messages(m: &DynamicMessage, name: &str) -> Vec<DynamicMessage> {
    match field(m, name) {
        Value::List(items) => items
            .into_iter()
            .filter_map(|v| v.as_message().cloned())
            .collect(),
        other => panic!("{name} is not a list: {other:?}"),
    }
}

fn message(m: &DynamicMessage, name: &str) -> DynamicMessage {
    field(m, name).as_message().cloned().unwrap()
}

fn int(m: &DynamicMessage, name: &str) -> i64 {
    match field(m, name) {
        Value::I32(n) => n.into(),
        Value::I64(n) => n,
        Value::U64(n) => n as i64,
        Value::U32(n) => n.into(),
        other => panic!("{name} is not an integer: {other:?}"),
    }
}

fn ints(m: &DynamicMessage, name: &str) -> Vec<i64> {
    match field(m, name) {
        Value::List(items) => items
            .iter()
            .map(|v| v.as_i32().map(i64::from).or(v.as_i64()).unwrap())
            .collect(),
        other => panic!("{name} is not a list: {other:?}"),
    }
}

/// An `AnyValue` as text (strings and integers are what is sent).
fn any(v: &DynamicMessage) -> String {
    match v.fields().next() {
        Some((_, Value::String(s))) => s.clone(),
        Some((_, Value::I64(n))) => n.to_string(),
        Some((_, other)) => format!("{other:?}"),
        None => String::new(),
    }
}

/// The element `i` of a dictionary table, refusing indices out of range.
fn at<'a, T>(table: &'a [T], i: i64, what: &str) -> Result<&'a T, String> {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .ok_or_else(|| format!("{what} index {i} out of range ({} entries)", table.len()))
}

/// Decodes a request and resolves its indices.
fn decode(body: &[u8]) -> Result<Vec<Profile>, String> {
    let request = DynamicMessage::decode(request_type(), body).map_err(|e| e.to_string())?;
    let dict = message(&request, "dictionary");
    let strings: Vec<String> = match field(&dict, "string_table") {
        Value::List(items) => items
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
        _ => unreachable!(),
    };
    if strings.first().map(String::as_str) != Some("") {
        return Err("string_table[0] is not \"\"".into());
    }
    let string = |i: i64| at(&strings, i, "string").cloned();
    let attributes: Vec<(String, String)> = messages(&dict, "attribute_table")
        .iter()
        .map(|a| Ok((string(int(a, "key_strindex"))?, any(&message(a, "value")))))
        .collect::<Result<_, String>>()?;
    let attrs = |ids: Vec<i64>| -> Result<BTreeMap<String, String>, String> {
        ids.into_iter()
            .map(|i| at(&attributes, i, "attribute").cloned())
            .collect()
    };
    let functions: Vec<String> = messages(&dict, "function_table")
        .iter()
        .map(|f| string(int(f, "name_strindex")))
        .collect::<Result<_, _>>()?;
    let mappings = messages(&dict, "mapping_table").len();
    let mut locations = Vec::new();
    for (n, l) in messages(&dict, "location_table").iter().enumerate() {
        at(&vec![(); mappings], int(l, "mapping_index"), "mapping")?;
        let lines = messages(l, "lines");
        let name = match lines.first() {
            Some(line) => at(&functions, int(line, "function_index"), "function")?.clone(),
            None => String::new(),
        };
        let ty = attrs(ints(l, "attribute_indices"))?
            .remove("profile.frame.type")
            .unwrap_or_default();
        if n > 0 && ty.is_empty() {
            return Err(format!("location {n} ({name}) has no profile.frame.type"));
        }
        locations.push((name, ty));
    }
    let stacks: Vec<Vec<(String, String)>> = messages(&dict, "stack_table")
        .iter()
        .map(|s| {
            ints(s, "location_indices")
                .into_iter()
                .map(|i| at(&locations, i, "location").cloned())
                .collect()
        })
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for rp in messages(&request, "resource_profiles") {
        let resource: BTreeMap<String, String> = messages(&message(&rp, "resource"), "attributes")
            .iter()
            .map(|kv| {
                (
                    field(kv, "key").as_str().unwrap().to_string(),
                    any(&message(kv, "value")),
                )
            })
            .collect();
        for sp in messages(&rp, "scope_profiles") {
            let scope = field(&message(&sp, "scope"), "name")
                .as_str()
                .unwrap()
                .to_string();
            for p in messages(&sp, "profiles") {
                let t = message(&p, "sample_type");
                let sample_type = format!(
                    "{}/{}",
                    string(int(&t, "type_strindex"))?,
                    string(int(&t, "unit_strindex"))?
                );
                let mut samples = Vec::new();
                for s in messages(&p, "samples") {
                    let values = ints(&s, "values");
                    let [value] = values[..] else {
                        return Err(format!("a sample of {} values", values.len()));
                    };
                    samples.push(Sample {
                        frames: at(&stacks, int(&s, "stack_index"), "stack")?.clone(),
                        attributes: attrs(ints(&s, "attribute_indices"))?,
                        value,
                    });
                }
                out.push(Profile {
                    resource: resource.clone(),
                    scope: scope.clone(),
                    sample_type,
                    time_unix_nano: int(&p, "time_unix_nano") as u64,
                    duration_nano: int(&p, "duration_nano") as u64,
                    samples,
                });
            }
        }
    }
    Ok(out)
}
