//! A string that must never be printed: Proxmox passwords and token secrets, the Omni key, join tokens.
//!
//! `Debug` prints a fixed placeholder and there is no `Display`, so a secret that ends up inside a
//! struct that is logged, or inside an error, cannot leak, and one formatted on its own does not
//! compile. Code that really needs the value calls [`Secret::expose`],
//! which makes every such place easy to find.

use std::fmt;

#[derive(Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself. Only for building an auth header, a signature or a seed file.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Reads a secret kept in a file (a Docker or Kubernetes secret): the whole file, without the
/// line break editors and `echo` leave at its end. The error names the file, never its content.
pub fn read_file(path: &std::path::Path) -> std::io::Result<Secret> {
    let text = std::fs::read_to_string(path)?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(std::io::Error::other("the file is empty"));
    }
    Ok(Secret::new(value))
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_the_value() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }
}
