//! Spec fields our message definitions do not know, kept so that writing a resource back does not
//! erase them. prost drops unknown fields when it decodes; a newer Omni or a newer official
//! provider may have written fields we lack (the official provider's `start_attempts`, field 14 of
//! the provider state, is one), and both read them again after our write.
//!
//! The fields are kept as their raw bytes and written in front of our encoding. Protobuf readers
//! accept fields in any order and the last value of a singular field wins, so a field we learn to
//! know later, or one we set ourselves, is never shadowed by a kept copy.

use std::collections::HashSet;
use std::ops::Range;

use prost::encoding::{DecodeContext, decode_key, skip_field};

/// The raw bytes of the fields of `raw` that re-encoding `decoded` (decoded from `raw`) leaves out:
/// fields the message does not define (and, harmlessly, explicitly encoded default values).
pub(super) fn unknown_fields<S: prost::Message>(raw: &[u8], decoded: &S) -> Vec<u8> {
    let encoded = decoded.encode_to_vec();
    let known: HashSet<u32> = fields(&encoded).map(|(tag, _)| tag).collect();
    let mut kept = Vec::new();
    for (tag, range) in fields(raw) {
        if !known.contains(&tag) {
            kept.extend_from_slice(&raw[range]);
        }
    }
    kept
}

/// `spec` encoded after the kept `unknown` fields.
pub(super) fn encode_keeping<S: prost::Message>(spec: &S, unknown: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(unknown.len() + spec.encoded_len());
    out.extend_from_slice(unknown);
    spec.encode_raw(&mut out);
    out
}

/// Each top-level field of a message: its tag and where its bytes are. Stops at the first malformed
/// field (the message decoded, so there is none).
fn fields(bytes: &[u8]) -> impl Iterator<Item = (u32, Range<usize>)> + '_ {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let start = bytes.len() - rest.len();
        let (tag, wire_type) = decode_key(&mut rest).ok()?;
        skip_field(wire_type, tag, &mut rest, DecodeContext::default()).ok()?;
        Some((tag, start..bytes.len() - rest.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::omni::proto::provider::MachineSpec;

    /// The official provider's state with a field we do not define: `start_attempts`, field 14 of
    /// its MachineSpec (siderolabs/omni-infra-provider-proxmox `api/specs/specs.proto`), and a
    /// length-delimited field from a release yet to come.
    fn official_state() -> Vec<u8> {
        let known = MachineSpec {
            uuid: "u-1".into(),
            vmid: 150,
            ..Default::default()
        };
        let mut raw = prost::Message::encode_to_vec(&known);
        raw.extend_from_slice(&[14 << 3, 3]); // start_attempts = 3 (varint)
        raw.extend_from_slice(&[(15 << 3) | 2, 2, b'h', b'i']); // field 15 = "hi"
        raw
    }

    #[test]
    fn unknown_fields_survive_a_rewrite() {
        let raw = official_state();
        let decoded: MachineSpec = prost::Message::decode(raw.as_slice()).unwrap();
        let unknown = unknown_fields(&raw, &decoded);
        assert_eq!(unknown, [14 << 3, 3, (15 << 3) | 2, 2, b'h', b'i']);
        let mut changed = decoded.clone();
        changed.vmid = 151;
        changed.node = "pve2".into();
        let written = encode_keeping(&changed, &unknown);
        let reread: MachineSpec = prost::Message::decode(written.as_slice()).unwrap();
        assert_eq!(reread, changed, "our fields as we set them");
        assert_eq!(
            unknown_fields(&written, &reread),
            unknown,
            "the unknown fields are still there after our write"
        );
    }

    #[test]
    fn a_kept_field_never_shadows_what_we_write() {
        // A known field explicitly encoded with its default value looks unknown; written in front,
        // our later value for it wins.
        let raw = [11 << 3, 0];
        let decoded: MachineSpec = prost::Message::decode(raw.as_slice()).unwrap();
        let unknown = unknown_fields(&raw, &decoded);
        let set = MachineSpec {
            vmid: 104,
            ..Default::default()
        };
        let written = encode_keeping(&set, &unknown);
        let reread: MachineSpec = prost::Message::decode(written.as_slice()).unwrap();
        assert_eq!(reread.vmid, 104);
    }
}
