//! Assembling a model file from chunks: append in order into `NAME.partial` in the final
//! folder while hashing, check the whole against the expected sha256, fsync, then rename to
//! `NAME` (atomic within one filesystem) and fsync the folder. A file at the final name has
//! therefore always been verified.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::error::HashMismatch;
use super::wheel::hex;

/// Suffix of files that are still being written; never a finished artifact.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// `dest` with [`PARTIAL_SUFFIX`] appended (`model.gguf` → `model.gguf.partial`).
pub fn partial_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(PARTIAL_SUFFIX);
    PathBuf::from(s)
}

/// Parses `sha256sum` output (`HEX  NAME` or `HEX *NAME` per line) and returns the lower-case
/// hex digest listed for `name`.
///
/// Errors: `name` is not listed, or its digest is not 64 hex digits.
pub fn sha256_for(sums: &str, name: &str) -> Result<String> {
    for line in sums.lines() {
        let Some((digest, rest)) = line.trim_end().split_once(char::is_whitespace) else {
            continue;
        };
        let file = rest.trim_start().trim_start_matches('*');
        if file == name {
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("SHA256SUMS: bad digest {digest:?} for {name}");
            }
            return Ok(digest.to_ascii_lowercase());
        }
    }
    bail!("SHA256SUMS does not list {name}")
}

/// Writes chunks in order into `dest.partial`, then verifies and renames it to `dest`.
///
/// Dropping an unfinished assembler deletes the partial file.
pub struct Assembler {
    dest: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    hasher: Sha256,
    len: u64,
}

impl Assembler {
    /// Creates (truncating) `dest.partial`. `dest`'s folder must exist.
    pub fn create(dest: &Path) -> Result<Self> {
        let tmp = partial_path(dest);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Self {
            dest: dest.to_path_buf(),
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            hasher: Sha256::new(),
            len: 0,
        })
    }

    /// A writer that appends to the assembly (bytes are hashed as they pass).
    pub fn writer(&mut self) -> AppendWriter<'_> {
        AppendWriter { asm: self }
    }

    /// Appends everything `reader` yields; returns the byte count. `label` names the chunk
    /// in errors.
    pub fn append_reader(&mut self, reader: &mut dyn Read, label: &str) -> Result<u64> {
        let n = std::io::copy(reader, &mut self.writer())
            .with_context(|| format!("appending {label} to {}", self.tmp.display()))?;
        Ok(n)
    }

    /// Bytes appended so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when nothing has been appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks the sha256 of all appended bytes against `expected_hex` (64 hex digits), then
    /// fsyncs the file, renames it to the final name and fsyncs the folder. Returns the final
    /// path.
    ///
    /// Errors: [`HashMismatch`] naming the file with expected and actual hex digests (the
    /// partial file is deleted and no final file appears), or an I/O error.
    pub fn finish(mut self, expected_hex: &str) -> Result<PathBuf> {
        let out = self.out.take().expect("assembler finished twice");
        let file = out
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", self.tmp.display()))?;
        let actual = hex(&std::mem::take(&mut self.hasher).finalize());
        if actual != expected_hex.to_ascii_lowercase() {
            drop(file);
            let _ = fs::remove_file(&self.tmp);
            return Err(HashMismatch {
                what: self
                    .dest
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                expected: expected_hex.to_string(),
                actual,
            }
            .into());
        }
        file.sync_all()
            .with_context(|| format!("fsync {}", self.tmp.display()))?;
        drop(file);
        fs::rename(&self.tmp, &self.dest).with_context(|| {
            format!("renaming {} to {}", self.tmp.display(), self.dest.display())
        })?;
        if let Some(dir) = self.dest.parent() {
            // Make the rename itself durable; a failure here leaves a correct file behind.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(self.dest.clone())
    }
}

impl Drop for Assembler {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writer returned by [`Assembler::writer`].
pub struct AppendWriter<'a> {
    asm: &'a mut Assembler,
}

impl Write for AppendWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let out = self.asm.out.as_mut().expect("assembler already finished");
        let n = out.write(buf)?;
        self.asm.hasher.update(&buf[..n]);
        self.asm.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.asm
            .out
            .as_mut()
            .expect("assembler already finished")
            .flush()
    }
}

/// Concatenates chunk files in order into `dest` through an [`Assembler`], checking the
/// result against `expected_hex`. Returns `dest`.
pub fn assemble_files(chunks: &[PathBuf], dest: &Path, expected_hex: &str) -> Result<PathBuf> {
    let mut asm = Assembler::create(dest)?;
    for c in chunks {
        let mut f = File::open(c).with_context(|| format!("opening chunk {}", c.display()))?;
        asm.append_reader(&mut f, &c.display().to_string())?;
    }
    asm.finish(expected_hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_for_reads_sha256sum_lines() {
        let sums = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  \
gemma-3-270m-q4_k_m.gguf\n";
        assert_eq!(
            sha256_for(sums, "gemma-3-270m-q4_k_m.gguf").unwrap(),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
        );
        let binary_mode = format!("{} *x.bin\n", "AB".repeat(32));
        assert_eq!(sha256_for(&binary_mode, "x.bin").unwrap(), "ab".repeat(32));
        assert_eq!(
            sha256_for(sums, "other.gguf").unwrap_err().to_string(),
            "SHA256SUMS does not list other.gguf"
        );
        assert_eq!(
            sha256_for("123  x\n", "x").unwrap_err().to_string(),
            "SHA256SUMS: bad digest \"123\" for x"
        );
    }

    #[test]
    fn partial_path_appends_suffix() {
        assert_eq!(
            partial_path(Path::new("/a/m.gguf")),
            PathBuf::from("/a/m.gguf.partial")
        );
    }
}
