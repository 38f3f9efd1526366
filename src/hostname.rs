//! Host names: this machine's, and the form in which names are compared.

/// A host name as compared: lowercase, without the trailing dot of a fully
/// qualified name.
pub fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// This machine's name (`gethostname`), lowercase.
pub fn this_host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most
    // that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..len]).ok()?;
    (!name.is_empty()).then(|| normalize(name))
}
