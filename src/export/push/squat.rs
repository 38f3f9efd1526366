//! Push and OTLP URLs another local user could take over: plain http to an
//! unprivileged port (>= 1024) on loopback. Any user may bind such a port
//! while the server is down (or before it starts) and then receives every
//! process's profiles; TLS (the server's certificate) or a privileged port
//! (only root binds it) rule that out. Warned about at start, logged and
//! listed in `/healthz` `warnings`.

use std::{net::IpAddr, sync::Mutex};

use url::{Host, Url};

/// The warnings given at start.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Whether `url` is plain http to a loopback port any user may bind.
pub fn squattable(url: &Url) -> bool {
    let loopback = match url.host() {
        Some(Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(Host::Ipv6(ip)) => ip.to_canonical().is_loopback(),
        Some(Host::Domain(name)) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
        None => false,
    };
    let port = url.port_or_known_default().unwrap_or(0);
    url.scheme() == "http" && loopback && port >= 1024
}

/// Logs and keeps a warning if `flag`'s `url` is [`squattable`].
pub fn warn_if_squattable(flag: &str, url: &Url) {
    if !squattable(url) {
        return;
    }
    let port = url.port_or_known_default().unwrap_or(0);
    let warning = format!(
        "{flag} is plain http to loopback port {port}, which any local user may bind \
         while the server is down and receive every process's profiles: use https or \
         a port below 1024"
    );
    tracing::warn!("{warning}");
    WARNINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(warning);
}

/// The warnings given so far (`/healthz` `warnings`).
pub fn warnings() -> Vec<String> {
    WARNINGS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn squat(url: &str) -> bool {
        squattable(&Url::parse(url).unwrap())
    }

    #[test]
    fn plain_http_to_an_unprivileged_loopback_port_is_squattable() {
        assert!(squat("http://127.0.0.1:4040"));
        assert!(squat("http://localhost:4318/"));
        assert!(squat("http://[::1]:4040"));
        assert!(squat("http://127.3.2.1:8080"));
    }

    #[test]
    fn tls_a_privileged_port_or_another_host_is_not() {
        assert!(!squat("https://127.0.0.1:4040"));
        assert!(!squat("http://127.0.0.1:443"));
        assert!(!squat("http://127.0.0.1"));
        assert!(!squat("http://10.0.0.5:4040"));
        assert!(!squat("http://pyroscope.example:4040"));
    }

    #[test]
    fn a_warning_is_kept_for_healthz() {
        let url = Url::parse("http://127.0.0.1:4040").unwrap();
        warn_if_squattable("--push-url", &url);
        assert!(warnings().iter().any(|w| w.contains("--push-url")));
    }
}
