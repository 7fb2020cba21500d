//! YAML parsing shared by the config file and provider data.
//!
//! serde-saphyr by default reads YAML 1.1 booleans (`no`, `yes`, `on`) even into untyped values, so
//! `vlan: no` would become `false`. Go's yaml.v3, which the official provider uses, keeps such words as
//! strings; strict booleans keep the two in agreement.

use serde_json::Value;

/// Parses one YAML document into a JSON value (empty input gives `null`).
pub fn from_str(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_str_with_options::<Value>(text, options).map_err(|e| e.to_string())
}
