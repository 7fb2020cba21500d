//! "Did you mean …?" suggestions for misspelled keys in the config file and in provider data.
//!
//! A typo such as `tokenId` for `tokenID` or `disk_sise` for `disk_size` would otherwise be silently
//! ignored (as the official provider does) and the user would wonder why their setting has no effect.

/// The closest known key to `unknown`, if it is close enough to be a plausible typo.
pub fn suggest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let lowered = unknown.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (*k, strsim::levenshtein(&lowered, &k.to_ascii_lowercase())))
        .filter(|(k, d)| *d <= (k.len() / 3).max(2))
        .min_by_key(|(_, d)| *d)
        .map(|(k, _)| k)
}

/// A sentence fragment for an error message: `" (did you mean `x`?)"` or empty.
pub fn hint(unknown: &str, known: &[&str]) -> String {
    suggest(unknown, known).map_or_else(String::new, |k| format!(" (did you mean `{k}`?)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_keys_only() {
        let known = ["tokenID", "tokenSecret", "insecureSkipVerify", "url"];
        assert_eq!(suggest("tokenId", &known), Some("tokenID"));
        assert_eq!(
            suggest("insecureSkipVerfy", &known),
            Some("insecureSkipVerify")
        );
        assert_eq!(suggest("completely-different", &known), None);
        assert_eq!(hint("urll", &known), " (did you mean `url`?)");
    }
}
