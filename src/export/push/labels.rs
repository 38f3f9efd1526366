//! Series labels, checked the way Pyroscope's distributor checks them
//! (`pkg/validation`): names `[a-zA-Z_][a-zA-Z0-9_]*`, names and values at
//! most 1,024 characters, at most 30 labels a series, `service_name`
//! always there.

use super::proto::LabelPair;

/// Most labels Pyroscope takes on one series (`max_label_names_per_series`).
pub const MAX_LABELS: usize = 30;
/// Longest label name and value Pyroscope takes, in characters.
pub const MAX_LENGTH: usize = 1024;
/// The label that names the profile type (`process_cpu`, …).
pub const NAME: &str = "__name__";
/// The label Grafana groups profiles by.
pub const SERVICE_NAME: &str = "service_name";
/// The label that names the host (this machine's name).
pub const HOSTNAME: &str = "hostname";
/// Room kept for the labels of a process's container (`container_id`,
/// pod, namespace, …): `--push-label`s are refused at startup when they
/// would not leave it.
pub const CONTAINER_LABELS: usize = 8;
/// The labels every series gets from wallscope itself.
const OWN: [&str; 3] = [NAME, SERVICE_NAME, HOSTNAME];

/// Parses a `--push-label NAME=VALUE`. An empty value removes a label
/// wallscope would set (`hostname`), as in Prometheus.
pub fn parse_label(arg: &str) -> Result<(String, String), String> {
    let (name, value) = arg
        .split_once('=')
        .ok_or_else(|| format!("`{arg}` is not NAME=VALUE"))?;
    check_name(name)?;
    if name.starts_with("__") {
        return Err(format!(
            "`{name}`: names starting with `__` are reserved (the profile type is `__name__`)"
        ));
    }
    if value.chars().count() > MAX_LENGTH {
        return Err(format!(
            "the value of `{name}` is over {MAX_LENGTH} characters"
        ));
    }
    if value.is_empty() && name == SERVICE_NAME {
        return Err("`service_name` cannot be empty: Pyroscope requires it".into());
    }
    Ok((name.to_string(), value.to_string()))
}

/// Whether `name` is a label name Pyroscope accepts.
pub fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "`{name}` is not a label name (letters, digits and `_`, not starting with a digit)"
        ));
    }
    if name.len() > MAX_LENGTH {
        return Err(format!("`{name}` is over {MAX_LENGTH} characters"));
    }
    Ok(())
}

/// `value` cut to [`MAX_LENGTH`] characters.
pub fn bounded(value: &str) -> String {
    value.chars().take(MAX_LENGTH).collect()
}

/// The labels a series is made of: wallscope's own, the process's
/// container's, then the `--push-label`s, which win over both.
#[derive(Debug, Clone)]
pub struct SeriesLabels {
    /// `--push-label`s, checked, last one of a name kept.
    extra: Vec<(String, String)>,
    hostname: String,
}

impl SeriesLabels {
    /// Checks `extra` against the series bound: with wallscope's own
    /// labels and room for [`CONTAINER_LABELS`], at most [`MAX_LABELS`].
    pub fn new(extra: Vec<(String, String)>, hostname: String) -> Result<SeriesLabels, String> {
        let mut kept: Vec<(String, String)> = Vec::new();
        for (name, value) in extra {
            kept.retain(|(n, _)| *n != name);
            kept.push((name, value));
        }
        let added = kept
            .iter()
            .filter(|(n, _)| !OWN.contains(&n.as_str()))
            .count();
        let room = MAX_LABELS - OWN.len() - CONTAINER_LABELS;
        if added > room {
            return Err(format!(
                "{added} --push-label names, but Pyroscope takes {MAX_LABELS} labels a series and \
                 wallscope needs {} of them ({}, and {CONTAINER_LABELS} for container labels): \
                 give at most {room}",
                OWN.len() + CONTAINER_LABELS,
                OWN.join(", ")
            ));
        }
        Ok(SeriesLabels {
            extra: kept,
            hostname: bounded(&hostname),
        })
    }

    /// [`SeriesLabels::new`] with this machine's name as `hostname`.
    pub fn for_this_host(extra: Vec<(String, String)>) -> Result<SeriesLabels, String> {
        let hostname = crate::hostname::this_host_name().unwrap_or_default();
        SeriesLabels::new(extra, hostname)
    }

    /// The labels of series `name` for a process of `service`, sorted by
    /// name (as Pyroscope keeps them), without empty values.
    pub fn series(
        &self,
        name: &str,
        service: &str,
        container: &[(&'static str, String)],
    ) -> Vec<LabelPair> {
        let service = if service.is_empty() {
            "unknown"
        } else {
            service
        };
        let own = [
            (NAME, name),
            (SERVICE_NAME, service),
            (HOSTNAME, &self.hostname),
        ];
        let mut labels: Vec<LabelPair> = Vec::with_capacity(MAX_LABELS);
        let mut set = |n: &str, v: &str| {
            labels.retain(|l| l.name != n);
            labels.push(LabelPair::new(n, bounded(v)));
        };
        for (n, v) in own {
            set(n, v);
        }
        // Container labels come from our own code, but a bad one must not
        // get the whole request refused.
        let container = container
            .iter()
            .filter(|(n, _)| check_name(n).is_ok())
            .take(CONTAINER_LABELS);
        for (n, v) in container {
            set(n, v);
        }
        for (n, v) in &self.extra {
            set(n, v);
        }
        labels.retain(|l| !l.value.is_empty());
        labels.sort();
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_bad_names_are_refused() {
        assert_eq!(
            parse_label("env=prod=eu").unwrap(),
            ("env".into(), "prod=eu".into())
        );
        assert_eq!(parse_label("hostname=").unwrap().1, "");
        for bad in [
            "env",
            "1env=x",
            "en-v=x",
            "=x",
            "__name__=x",
            "é=x",
            "service_name=",
        ] {
            assert!(parse_label(bad).is_err(), "{bad}");
        }
        let long = format!("a={}", "x".repeat(MAX_LENGTH + 1));
        assert!(parse_label(&long).is_err());
    }

    #[test]
    fn push_labels_win_and_empty_values_remove() {
        let extra = vec![
            ("service_name".into(), "checkout".into()),
            ("env".into(), "dev".into()),
            ("env".into(), "prod".into()),
            ("hostname".into(), "".into()),
        ];
        let labels = SeriesLabels::new(extra, "box".into()).unwrap();
        let got = labels.series("process_cpu", "java", &[("pod", "web-1".into())]);
        let pairs: Vec<(&str, &str)> = got
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("__name__", "process_cpu"),
                ("env", "prod"),
                ("pod", "web-1"),
                ("service_name", "checkout"),
            ]
        );
        let plain = SeriesLabels::new(Vec::new(), "box".into()).unwrap();
        let got = plain.series("process_cpu", "", &[("bad-name", "x".into())]);
        assert_eq!(got.len(), 3);
        assert!(got.contains(&LabelPair::new("service_name", "unknown")));
    }

    #[test]
    fn too_many_push_labels_are_refused() {
        let room = MAX_LABELS - OWN.len() - CONTAINER_LABELS;
        let labels = |n: usize| {
            (0..n)
                .map(|i| (format!("l{i}"), "v".to_string()))
                .collect::<Vec<_>>()
        };
        assert!(SeriesLabels::new(labels(room), "h".into()).is_ok());
        let e = SeriesLabels::new(labels(room + 1), "h".into()).unwrap_err();
        assert!(e.contains(&format!("at most {room}")), "{e}");
        // Overriding wallscope's own labels takes no room.
        let mut own = labels(room);
        own.push(("hostname".into(), "x".into()));
        assert!(SeriesLabels::new(own, "h".into()).is_ok());
    }
}
