//! How the token reaches the machine: the SideroLink API URL with the token in its query, encoded
//! as Go's `net/url` encodes it, and the three Talos documents of the join config.

use crate::secret::Secret;

/// The API URL with `jointoken` (and `grpc_tunnel=true`) added to its query, re-encoded the way Go's
/// `url.Values.Encode` does (keys sorted, form escaping); everything before the query is kept verbatim.
pub(super) fn siderolink_api_url(api_url: &str, token: &Secret, grpc_tunnel: bool) -> String {
    // The fragment with its `#`, if any.
    let (without_fragment, fragment) = api_url.split_at(api_url.find('#').unwrap_or(api_url.len()));
    let (base, query) = without_fragment
        .split_once('?')
        .unwrap_or((without_fragment, ""));
    // Go's `url.ParseQuery`, lenient: a malformed escape is kept as written.
    let mut values: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    values.push(("jointoken".into(), token.expose().to_owned()));
    if grpc_tunnel {
        values.push(("grpc_tunnel".into(), "true".into()));
    }
    // Keys sorted, the values of one key in their order (a stable sort), as Go's map of lists.
    values.sort_by(|a, b| a.0.cmp(&b.0));
    let encoded: Vec<String> = (values.iter())
        .map(|(k, v)| format!("{}={}", query_escape(k), query_escape(v)))
        .collect();
    format!("{base}?{}{fragment}", encoded.join("&"))
}

/// Go's `url.QueryEscape`. The form encoding differs from it in two bytes only: it keeps `*`, which
/// Go escapes, and escapes `~`, which Go keeps. Every `%` of its output starts an escape, so `%7E`
/// can only be an escaped `~`.
pub(super) fn query_escape(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('*', "%2A")
        .replace("%7E", "~")
}

/// First host of the SideroLink ULA /64 for an empty installation ID: where Talos sends events and logs.
const SIDEROLINK_HOST: &str = "fdae:41e4:649b:9303::1";

/// The three Talos documents, apiVersion and kind first, `---` between them, trailing newline:
/// Omni's API at `api_url` (with the token, so the whole is secret), events and kernel logs to the
/// SideroLink host on their ports.
pub(super) fn render_join_config(api_url: &str, events_port: u16, logs_port: u16) -> Secret {
    Secret::new(format!(
        "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: {}\n---\n\
         apiVersion: v1alpha1\nkind: EventSinkConfig\nendpoint: {}\n---\n\
         apiVersion: v1alpha1\nkind: KmsgLogConfig\nname: omni-kmsg\nurl: {}\n",
        yaml_scalar(api_url),
        yaml_scalar(&format!("[{SIDEROLINK_HOST}]:{events_port}")),
        yaml_scalar(&format!("tcp://[{SIDEROLINK_HOST}]:{logs_port}"))
    ))
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

    /// Go's `url.Values.Encode`: keys sorted, the values of one key in the order they came.
    #[test]
    fn repeated_keys_keep_their_order_and_the_fragment_stays() {
        let url = siderolink_api_url("https://o/p?b=2&a=1&b=1#frag", &Secret::new("t"), true);
        assert_eq!(
            url,
            "https://o/p?a=1&b=2&b=1&grpc_tunnel=true&jointoken=t#frag"
        );
    }

    /// Go's `shouldEscape` for a query component (net/url): letters, digits and `-_.~` stay, a
    /// space becomes `+`, every other byte `%XX` in upper-case hex.
    #[test]
    fn query_escape_is_gos_for_every_ascii_character() {
        for b in 0u8..=127 {
            let go = match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_string(),
                _ => format!("%{b:02X}"),
            };
            assert_eq!(query_escape(&(b as char).to_string()), go, "byte {b}");
        }
        assert_eq!(query_escape("é"), "%C3%A9");
    }

    proptest! {
        #[test]
        fn query_escape_round_trips(s in "\\PC{0,30}") {
            let escaped = query_escape(&s);
            let unescaped: String = url::form_urlencoded::parse(format!("k={escaped}").as_bytes())
                .map(|(_, v)| v.into_owned())
                .collect();
            prop_assert_eq!(unescaped, s);
        }
    }
}
