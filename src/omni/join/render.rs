//! How the token reaches the machine: the SideroLink API URL with the token in its query, encoded
//! as Go's `net/url` encodes it, and the three Talos documents of the join config.

use std::collections::BTreeMap;

use crate::secret::Secret;

/// The API URL with `jointoken` (and `grpc_tunnel=true`) added to its query, re-encoded the way Go's
/// `url.Values.Encode` does (keys sorted, form escaping); everything before the query is kept verbatim.
pub(super) fn siderolink_api_url(api_url: &str, token: &Secret, grpc_tunnel: bool) -> String {
    let (without_fragment, fragment) = match api_url.split_once('#') {
        Some((a, f)) => (a, Some(f)),
        None => (api_url, None),
    };
    let (base, query) = match without_fragment.split_once('?') {
        Some((b, q)) => (b, q),
        None => (without_fragment, ""),
    };
    let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        values
            .entry(query_unescape(k))
            .or_default()
            .push(query_unescape(v));
    }
    values
        .entry("jointoken".into())
        .or_default()
        .push(token.expose().to_string());
    if grpc_tunnel {
        values
            .entry("grpc_tunnel".into())
            .or_default()
            .push("true".into());
    }
    let encoded: Vec<String> = values
        .iter()
        .flat_map(|(k, vs)| {
            vs.iter()
                .map(move |v| format!("{}={}", query_escape(k), query_escape(v)))
        })
        .collect();
    let mut out = format!("{base}?{}", encoded.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// Go's `url.QueryEscape`.
pub(super) fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Go's `url.QueryUnescape`, lenient: a malformed escape is kept as written.
fn query_unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len()
                && bytes[i + 1].is_ascii_hexdigit()
                && bytes[i + 2].is_ascii_hexdigit() =>
            {
                out.push(hex_value(bytes[i + 1]) << 4 | hex_value(bytes[i + 2]));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

/// The three Talos documents, apiVersion and kind first, `---` between them, trailing newline.
pub(super) fn render_join_config(api_url: &str, events_sink: &str, logs_url: &str) -> String {
    format!(
        "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: {}\n---\n\
         apiVersion: v1alpha1\nkind: EventSinkConfig\nendpoint: {}\n---\n\
         apiVersion: v1alpha1\nkind: KmsgLogConfig\nname: omni-kmsg\nurl: {}\n",
        yaml_scalar(api_url),
        yaml_scalar(events_sink),
        yaml_scalar(logs_url)
    )
}

/// A YAML scalar: plain when it is unambiguous, else single-quoted (as the Go emitter does for
/// `[fdae:…]:port`, which would otherwise start a flow sequence).
fn yaml_scalar(s: &str) -> String {
    let plain_safe = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_graphic())
        && !s.starts_with(|c: char| "[]{}!&*#|>'\"%@`,?:-".contains(c))
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.ends_with(':');
    if plain_safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn query_escape_round_trips(s in "\\PC{0,30}") {
            prop_assert_eq!(query_unescape(&query_escape(&s)), s);
        }
    }
}
