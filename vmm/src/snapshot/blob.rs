//! KVM's plain structures in `state.json`: their bytes as a hex string, read back only at
//! exactly the structure's size (a short or long string is a damaged file, not zero padding).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Bytes written as lower-case hex.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blob(pub Vec<u8>);

impl Blob {
    /// The bytes of `value`.
    pub fn of<T: IntoBytes + Immutable>(value: &T) -> Self {
        Blob(value.as_bytes().to_vec())
    }

    /// The structure these bytes hold; `what` names the field in the error.
    pub fn to<T: FromBytes>(&self, what: &str) -> Result<T, String> {
        T::read_from_bytes(&self.0).map_err(|_| {
            format!(
                "{what} is {} bytes, not the {} its structure has",
                self.0.len(),
                std::mem::size_of::<T>()
            )
        })
    }
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Each byte's value as a hex digit, [`NOT_HEX`] for the rest.
const VALUES: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 16 {
        t[DIGITS[i] as usize] = i as u8;
        i += 1;
    }
    t
};
const NOT_HEX: u8 = 0xff;

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Written into place a pair at a time (a migration encodes this in its downtime).
        let mut text = vec![0u8; self.0.len() * 2];
        for (pair, b) in text.chunks_exact_mut(2).zip(&self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        let text = String::from_utf8(text).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }
}

/// Parses lower-case hex of an even length.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    if bytes.len() % 2 != 0 {
        return Err("a hex string of odd length".into());
    }
    if bytes.iter().any(|&c| VALUES[usize::from(c)] == NOT_HEX) {
        return Err("a character that is not lower-case hex".into());
    }
    let value = |c: u8| VALUES[usize::from(c)];
    Ok(bytes
        .chunks_exact(2)
        .map(|pair| value(pair[0]) << 4 | value(pair[1]))
        .collect())
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        parse_hex(&text).map(Blob).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_round_trip_and_only_at_their_size() {
        let regs = kvm_bindings::kvm_regs {
            rip: 0x1234_5678,
            rflags: 2,
            ..Default::default()
        };
        let blob = Blob::of(&regs);
        let text = serde_json::to_string(&blob).unwrap();
        assert!(text.starts_with('"') && text.len() == 2 + 2 * 144, "{text}");
        let back: Blob = serde_json::from_str(&text).unwrap();
        let again: kvm_bindings::kvm_regs = back.to("regs").unwrap();
        assert_eq!((again.rip, again.rflags), (0x1234_5678, 2));
        let short = Blob(back.0[..100].to_vec());
        let e = short.to::<kvm_bindings::kvm_regs>("regs").unwrap_err();
        assert_eq!(e, "regs is 100 bytes, not the 144 its structure has");
        for bad in ["\"abc\"", "\"zz\"", "\"AB\"", "12"] {
            assert!(serde_json::from_str::<Blob>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_byte_is_two_lower_case_digits_and_reads_back() {
        let all = Blob((0..=255).collect());
        let text = serde_json::to_string(&all).unwrap();
        let want: String = (0..=255u8).map(|b| format!("{b:02x}")).collect();
        assert_eq!(text, format!("\"{want}\""));
        assert_eq!(serde_json::from_str::<Blob>(&text).unwrap(), all);
        assert_eq!(
            parse_hex("0f/0").unwrap_err(),
            "a character that is not lower-case hex"
        );
    }
}
