//! Expert record checksums: XXH3-128, which packs record beside the SHA-256 and every read
//! checks by default (fast enough to be always on), or SHA-256 for packs written before
//! XXH3-128 was recorded.

/// One expert record's checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordSum {
    /// XXH3-128 of the record's bytes (big-endian, as the manifest's hex reads).
    Xxh3([u8; 16]),
    /// SHA-256 of the record's bytes.
    Sha256([u8; 32]),
}

impl RecordSum {
    /// Whether `bytes` have this checksum.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        match self {
            RecordSum::Xxh3(want) => &xxh3_128(bytes) == want,
            RecordSum::Sha256(want) => {
                use sha2::Digest;
                let got: [u8; 32] = sha2::Sha256::digest(bytes).into();
                &got == want
            }
        }
    }

    /// The algorithm's name (`xxh3-128`, `SHA-256`).
    pub fn algorithm(&self) -> &'static str {
        match self {
            RecordSum::Xxh3(_) => "xxh3-128",
            RecordSum::Sha256(_) => "SHA-256",
        }
    }
}

/// XXH3-128 of `bytes`, big-endian.
pub fn xxh3_128(bytes: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(bytes).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh3_128_of_known_inputs() {
        // the reference implementation's XXH3_128bits of "" (seed 0), in canonical form
        assert_eq!(
            xxh3_128(b"")
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            "99aa06d3014798d86001c324468d497f"
        );
        let s = RecordSum::Xxh3(xxh3_128(b"record"));
        assert!(s.matches(b"record") && !s.matches(b"recorD"));
    }
}
