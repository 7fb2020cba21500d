//! YAML parsing shared by the config file and provider data.
//!
//! serde-saphyr by default reads YAML 1.1 booleans (`no`, `yes`, `on`) even into untyped values, so
//! `vlan: no` would become `false`. Go's yaml.v3, which the official provider uses, keeps such words as
//! strings; strict booleans keep the two in agreement.

use serde_json::Value;

/// Parses one YAML document into a JSON value (empty input gives `null`).
///
/// The error says what is wrong and where (line and column), never the text around it: the
/// parser's own rendering quotes the lines near the mistake, and in a config file those hold the
/// Proxmox token secret or password.
pub fn from_str(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_str_with_options::<Value>(text, options)
        .map_err(|e| e.without_snippet().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_names_line_and_column_and_quotes_no_line() {
        for (text, place) in [
            (
                "proxmox:\n  tokenSecret: s3cr3t-value\n  url: [unclosed\n",
                "line 3, column 8",
            ),
            (
                "proxmox:\n  tokenSecret: s3cr3t-value: more\n",
                "line 2, column 28",
            ),
            (
                "proxmox:\n  tokenSecret: \"s3cr3t-value\n",
                "line 3, column 1",
            ),
        ] {
            let err = from_str(text).unwrap_err();
            assert!(err.contains(place), "{err}");
            assert!(!err.contains("s3cr3t"), "{err}");
        }
    }
}
