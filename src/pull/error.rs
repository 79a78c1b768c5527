//! The error of a failed sha256 check, shared by every step of a pull (wheel members,
//! downloads, the assembled file).

/// A sha256 check that failed. `expected` and `actual` are in the form the reference uses
/// (lower-case hex, or urlsafe base64 for wheel RECORD rows).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sha256 mismatch for {what}: expected {expected}, got {actual}")]
pub struct HashMismatch {
    /// The file or member checked.
    pub what: String,
    /// Digest from the reference (index, RECORD, SHA256SUMS).
    pub expected: String,
    /// Digest of the bytes received.
    pub actual: String,
}
