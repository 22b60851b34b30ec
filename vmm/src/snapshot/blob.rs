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

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut text = String::with_capacity(self.0.len() * 2);
        for b in &self.0 {
            text.push(DIGITS[usize::from(b >> 4)] as char);
            text.push(DIGITS[usize::from(b & 0xf)] as char);
        }
        s.serialize_str(&text)
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Parses lower-case hex of an even length.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    if bytes.len() % 2 != 0 {
        return Err("a hex string of odd length".into());
    }
    bytes
        .chunks_exact(2)
        .map(|pair| match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
            _ => Err("a character that is not lower-case hex".into()),
        })
        .collect()
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
}
