//! Label queries as COSI's state evaluates them, for List and Watch: terms of one query must all
//! hold, and any one query matching is enough.

use std::collections::HashMap;

use tonic::Status;

use omni_infra_provider_proxmox::omni::proto::cosi::resource as pb;

/// Whether `labels` match any of `queries` (none = everything). Pure.
pub(super) fn matches_queries(
    labels: &HashMap<String, String>,
    queries: &[pb::LabelQuery],
) -> Result<bool, Status> {
    if queries.is_empty() {
        return Ok(true);
    }
    for q in queries {
        let mut all = true;
        for t in &q.terms {
            if !term_matches(labels, t)? {
                all = false;
                break;
            }
        }
        if all {
            return Ok(true);
        }
    }
    Ok(false)
}

fn term_matches(labels: &HashMap<String, String>, t: &pb::LabelTerm) -> Result<bool, Status> {
    use pb::label_term::Operation as Op;
    let op = Op::try_from(t.op).map_err(|_| {
        Status::unimplemented(format!("unsupported label query operator: {}", t.op))
    })?;
    let first = || {
        t.value
            .first()
            .ok_or_else(|| Status::internal("runtime error: index out of range [0] with length 0"))
    };
    let have = labels.get(&t.key);
    let result = match op {
        Op::Exists => have.is_some(),
        Op::NotExists => have.is_none(),
        Op::Equal => have == Some(first()?),
        Op::In => have.is_some_and(|v| t.value.contains(v)),
        Op::Lt => have.is_some_and(|v| v.as_str() < first().map(|s| s.as_str()).unwrap_or("")),
        Op::Lte => have.is_some_and(|v| v.as_str() <= first().map(|s| s.as_str()).unwrap_or("")),
        Op::LtNumeric | Op::LteNumeric => {
            let bound: i64 = first()?.parse().unwrap_or(i64::MIN);
            have.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| {
                if op == Op::LtNumeric {
                    v < bound
                } else {
                    v <= bound
                }
            })
        }
    };
    Ok(result != t.invert)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::label_term::Operation as Op;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn term(key: &str, op: Op, values: &[&str], invert: bool) -> pb::LabelTerm {
        pb::LabelTerm {
            key: key.into(),
            op: op as i32,
            value: values.iter().map(|s| s.to_string()).collect(),
            invert,
        }
    }

    #[test]
    fn label_queries_and_or() {
        let l = labels(&[("a", "1"), ("b", "x")]);
        let q = |terms| pb::LabelQuery { terms };
        assert!(matches_queries(&l, &[]).unwrap());
        assert!(
            matches_queries(
                &l,
                &[q(vec![
                    term("a", Op::Equal, &["1"], false),
                    term("b", Op::Exists, &[], false)
                ])]
            )
            .unwrap()
        );
        assert!(!matches_queries(&l, &[q(vec![term("a", Op::Equal, &["2"], false)])]).unwrap());
        assert!(
            matches_queries(
                &l,
                &[
                    q(vec![term("a", Op::Equal, &["2"], false)]),
                    q(vec![term("b", Op::In, &["y", "x"], false)])
                ]
            )
            .unwrap()
        );
        assert!(matches_queries(&l, &[q(vec![term("c", Op::Exists, &[], true)])]).unwrap());
        assert!(matches_queries(&l, &[q(vec![term("a", Op::LtNumeric, &["2"], false)])]).unwrap());
        assert_eq!(
            matches_queries(&l, &[q(vec![term("a", Op::Equal, &[], false)])])
                .unwrap_err()
                .code(),
            tonic::Code::Internal
        );
    }
}
