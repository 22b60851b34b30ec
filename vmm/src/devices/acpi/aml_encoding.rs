//! What both AML builders ([`super::aml`], [`super::memory_aml`]) need from `acpi_tables`
//! beyond its own types: an item's bytes, and bytes already encoded as an item.

use acpi_tables::Aml;

/// The AML encoding of `item`.
pub(super) fn bytes(item: &dyn Aml) -> Vec<u8> {
    let mut out = Vec::new();
    item.to_aml_bytes(&mut out);
    out
}

/// AML already encoded, as a child of a device or method.
pub(super) struct Encoded(pub(super) Vec<u8>);

impl Aml for Encoded {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}
