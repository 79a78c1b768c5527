//! The local copy of a pack on object storage: what `run -m s3://…` opens. Its manifest, the
//! spine file and the copied files (tokenizer, config) are fetched once, checked against the
//! manifest's checksums, and kept in a folder under the local cache root; the manifest is
//! rewritten to name the folder's `experts.bin` (a sparse mirror of the expert object, filled
//! by the local tier when one is kept) as its one drive file; `remote.json`, written last,
//! marks the copy complete and names where the records come from. The folder is then a pack
//! like any other, so everything that opens packs opens it. A copy is made again when the
//! remote manifest changes.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::source::pack::{hex, Manifest, FORMAT_VERSION, MANIFEST, MAX_MANIFEST_BYTES};
use crate::store::remote::spec::{EXPERTS_OBJECT, MARKER};
use crate::store::remote::{FetchOptions, Remote, RemoteSpec, S3Url};

/// Bytes of one GET while the spine is fetched.
const SPINE_CHUNK: u64 = 8 << 20;

/// The folder of the local copy of `url` under `root`: `BUCKET-PREFIX-HASH` (the prefix's
/// slashes as `_`, HASH 8 bytes of the URL's SHA-256).
pub fn copy_dir(root: &Path, url: &S3Url) -> PathBuf {
    let h = Sha256::digest(url.to_string().as_bytes());
    let name = format!("{}-{}", url.bucket, url.prefix.replace('/', "_"));
    root.join(format!("{}-{}", name.trim_end_matches('-'), hex(&h[..8])))
}

/// Writes `bytes` to `p` through a synced temporary file renamed over it.
fn write_atomic(p: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = p.with_extension("tmp");
    let mut f = File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, p).with_context(|| format!("{}", p.display()))
}

/// Reads and checks the manifest of the pack at `url`: its text and the manifest.
///
/// Errors: no manifest (no pack there, or an upload not finished), a manifest too large,
/// malformed, of another format version, failing its field checks, or not laid out for
/// object storage (the messages name the URL).
pub fn remote_manifest(remote: &Remote, url: &S3Url) -> Result<(Vec<u8>, Manifest)> {
    let Some(text) = remote.get_small(MANIFEST, MAX_MANIFEST_BYTES)? else {
        bail!(
            "{url}: no pack there ({} is missing; an upload that did not finish has none)",
            url.object(MANIFEST)
        );
    };
    let name = url.object(MANIFEST);
    let m: Manifest =
        serde_json::from_slice(&text).with_context(|| format!("{name}: malformed"))?;
    if m.format_version != FORMAT_VERSION {
        bail!(
            "{name}: pack format version {} (this Deltafin reads version {FORMAT_VERSION})",
            m.format_version
        );
    }
    m.check_fields(Path::new(&url.to_string()))?;
    if m.drives.len() != 1
        || m.stripe_chunk.is_some()
        || m.experts.iter().any(|r| r.extents.len() != 1)
    {
        bail!("{name}: not laid out for object storage (one expert object, whole records); upload the pack with `deltafin pack -m PACK --out {url}`");
    }
    Ok((text, m))
}

/// Makes (or finds up to date) the local copy of the pack at `url` in its folder under `root`
/// ([`copy_dir`]) and returns the folder (see the module docs). Processes making the same
/// copy take turns (a lock in the folder).
///
/// Errors: the URL is malformed; the manifest cannot be fetched or fails its checks
/// ([`remote_manifest`]); the spine or a copied file cannot be fetched or does not match its
/// checksum (naming it); a local file cannot be written.
pub fn local_copy(url: &str, root: &Path, fetch: &FetchOptions) -> Result<PathBuf> {
    let url = S3Url::parse(url).map_err(anyhow::Error::msg)?;
    let dir = copy_dir(root, &url);
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("copy.lock"))
        .with_context(|| format!("{}", dir.display()))?;
    // SAFETY: a plain syscall on an open descriptor; the lock goes with the file.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    let remote = Remote::connect(&url, fetch.clone())?;
    let (text, m) = remote_manifest(&remote, &url)?;
    let identity = hex(&Sha256::digest(&text));
    let spec = RemoteSpec {
        url: url.to_string(),
        object: EXPERTS_OBJECT.into(),
        manifest_sha256: identity.clone(),
    };
    if RemoteSpec::read(&dir).ok().flatten().as_ref() == Some(&spec) {
        return Ok(dir);
    }
    let _ = std::fs::remove_file(dir.join(MARKER));
    fetch_spine(&remote, &url, &m, &dir)?;
    for f in &m.copied_files {
        let name = url.object(f);
        let Some(b) = remote.get_small(f, 64 << 20)? else {
            bail!("{name}: missing");
        };
        match m.file_sha256.get(f) {
            Some(h) if &hex(&Sha256::digest(&b)) != h => {
                bail!("{name}: checksum mismatch (the file differs from the one packed)")
            }
            _ => write_atomic(&dir.join(f), &b)?,
        }
    }
    let mut local = m.clone();
    let mirror = dir.join(EXPERTS_OBJECT);
    local.drives[0].path = dir.display().to_string();
    local.drives[0].file = mirror.display().to_string();
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&mirror)
        .with_context(|| format!("{}", mirror.display()))?;
    if f.metadata()?.len() != local.drives[0].len {
        f.set_len(local.drives[0].len)
            .with_context(|| format!("{}", mirror.display()))?;
    }
    write_atomic(
        &dir.join(MANIFEST),
        serde_json::to_string_pretty(&local)?.as_bytes(),
    )?;
    write_atomic(
        &dir.join(MARKER),
        serde_json::to_string_pretty(&spec)?.as_bytes(),
    )?;
    Ok(dir)
}

/// Fetches the spine file of the pack `m` at `url` into `dir` (chunked GETs, in flight
/// together) and checks its GGUF header and every spine tensor against their checksums.
///
/// Errors: the object is missing or shorter than the manifest says, a GET fails (after the
/// retries), or a checksum does not match (naming the tensor).
fn fetch_spine(remote: &Remote, url: &S3Url, m: &Manifest, dir: &Path) -> Result<()> {
    let name = url.object(&m.spine_file);
    match remote.size(&m.spine_file)? {
        None => bail!("{name}: missing"),
        Some(n) if n < m.spine_len => {
            bail!("{name}: {n} bytes, the manifest says {}", m.spine_len)
        }
        _ => {}
    }
    let part = dir.join(format!("{}.part", m.spine_file));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&part)
        .with_context(|| format!("{}", part.display()))?;
    f.set_len(m.spine_len)?;
    let chunks: Vec<u64> = (0..m.spine_len.div_ceil(SPINE_CHUNK)).collect();
    let client = remote.client.clone();
    let width = client.opts.concurrency.max(1);
    for group in chunks.chunks(width) {
        let got = remote.block_on(async {
            let mut hs = Vec::new();
            for &c in group {
                let (cl, sf) = (client.clone(), m.spine_file.clone());
                let r = c * SPINE_CHUNK..((c + 1) * SPINE_CHUNK).min(m.spine_len);
                hs.push(tokio::spawn(async move {
                    cl.get_range(&sf, r.clone(), None)
                        .await
                        .map(|b| (r.start, b))
                }));
            }
            let mut out = Vec::new();
            for h in hs {
                out.push(h.await.map_err(std::io::Error::other)?);
            }
            Ok::<_, std::io::Error>(out)
        })?;
        for r in got {
            let (at, b) = r?;
            f.write_all_at(&b, at)
                .with_context(|| format!("{}", part.display()))?;
        }
    }
    f.sync_all()?;
    let check = |what: &str, off: u64, len: u64, want: &str| -> Result<()> {
        let mut b = vec![0u8; len as usize];
        f.read_exact_at(&mut b, off)?;
        if hex(&Sha256::digest(&b)) != want {
            bail!(
                "{name}: {what}: checksum mismatch (the spine fetched differs from the one packed)"
            );
        }
        Ok(())
    };
    if let Some(h) = &m.spine_header {
        check("the GGUF header", 0, h.len, &h.sha256)?;
    }
    for t in m.tensors.iter().filter(|t| t.file == 0) {
        let want = t.sha256.as_deref().unwrap_or_default();
        check(
            &format!("spine tensor '{}'", t.name),
            t.offset,
            t.n_bytes,
            want,
        )?;
    }
    let to = dir.join(&m.spine_file);
    std::fs::rename(&part, &to).with_context(|| format!("{}", to.display()))?;
    Ok(())
}
