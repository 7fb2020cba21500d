//! "Did you mean …?" suggestions for misspelled keys in the config file and in provider data.
//!
//! A typo such as `tokenId` for `tokenID` or `disk_sise` for `disk_size` would otherwise be silently
//! ignored (as the official provider does) and the user would wonder why their setting has no effect.

/// The closest known key to `unknown`, if it is close enough to be a plausible typo.
pub fn suggest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let lowered = unknown.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (*k, distance(&lowered, &k.to_ascii_lowercase())))
        .filter(|(k, d)| *d <= (k.len() / 3).max(2))
        .min_by_key(|(_, d)| *d)
        .map(|(k, _)| k)
}

/// A sentence fragment for an error message: `" (did you mean `x`?)"` or empty.
pub fn hint(unknown: &str, known: &[&str]) -> String {
    match suggest(unknown, known) {
        Some(k) => format!(" (did you mean `{k}`?)"),
        None => String::new(),
    }
}

/// Levenshtein distance, case already folded by the caller.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
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
