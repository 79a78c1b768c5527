//! `deltafin pack -m PACK --out s3://BUCKET/PREFIX`: uploading a finished local pack in the
//! object layout (`layout.rs`). The expert object and the spine go up in parts (multipart
//! uploads, `--part-size` each, several in flight), the small files in one PUT each, and the
//! manifest last, so that a pack on object storage is complete only once its manifest is
//! there, as on a drive. Every record is read back from the local pack and checked against
//! its checksum before it is sent. A journal beside the local pack
//! (`upload-HASH.json`, HASH from the URL) keeps each upload's id and the ETags of the parts
//! sent; a run that was killed resumes from it, sending only the parts missing (a part is in
//! the journal only once the store has acknowledged it).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::layout::{record_offsets, remote_manifest};
use crate::source::pack::{hex, Manifest, MANIFEST};
use crate::store::checksum::xxh3_128;
use crate::store::remote::spec::EXPERTS_OBJECT;
use crate::store::remote::{FetchOptions, Remote, S3Url};

/// How [`upload_pack`] runs.
#[derive(Clone, Debug)]
pub struct UploadOptions {
    /// Bytes of one part of a multipart upload (S3 takes 5 MiB at least, but the last).
    pub part_bytes: u64,
    /// Parts in flight (`concurrency`), the timeout and retries of requests.
    pub fetch: FetchOptions,
    /// Replace a different pack already at the URL.
    pub overwrite: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Tests: end the process (exit status 137, as if killed) once this many parts were sent.
    pub stop_after_parts: Option<usize>,
}

/// Default part size: 8 MiB.
pub const DEFAULT_PART_BYTES: u64 = 8 << 20;

/// What [`upload_pack`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UploadReport {
    /// Parts and whole objects sent in this run.
    pub sent: usize,
    /// Parts and objects found sent by an earlier run (the journal).
    pub skipped: usize,
    /// Bytes sent in this run.
    pub bytes: u64,
    /// The pack was there already (the same manifest): nothing was sent.
    pub already: bool,
}

/// One object's upload in the journal.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ObjectUpload {
    #[serde(default)]
    upload_id: Option<String>,
    #[serde(default)]
    etags: Vec<Option<String>>,
    #[serde(default)]
    done: bool,
}

/// The journal of an upload.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Journal {
    url: String,
    manifest_sha256: String,
    part_bytes: u64,
    objects: BTreeMap<String, ObjectUpload>,
}

/// Where an object's bytes come from.
enum Source<'a> {
    /// The expert object, assembled from the local pack's records.
    Experts(&'a Records<'a>),
    /// A local file, read from offset 0.
    File(PathBuf),
}

/// The local pack's records, read and checked, for assembling the expert object.
struct Records<'a> {
    m: &'a Manifest,
    dir: &'a Path,
    files: Vec<File>,
    offs: Vec<u64>,
}

impl Records<'_> {
    /// Bytes `range` of the expert object.
    fn read(&self, start: u64, end: u64) -> Result<Vec<u8>> {
        let mut out = vec![0u8; (end - start) as usize];
        let first = self.offs.partition_point(|&o| o <= start).saturating_sub(1);
        for ri in first..self.m.experts.len() {
            let o = self.offs[ri];
            if o >= end {
                break;
            }
            let r = &self.m.experts[ri];
            if o + r.len <= start {
                continue;
            }
            let mut b = vec![0u8; r.len as usize];
            for x in &r.extents {
                let dst = &mut b[x.record_offset as usize..(x.record_offset + x.len) as usize];
                self.files[x.drive]
                    .read_exact_at(dst, x.offset)
                    .with_context(|| self.m.drive_label(x.drive))?;
            }
            let sum = match r.xxh3.as_deref() {
                Some(h) => hex(&xxh3_128(&b)) == h,
                None => hex(&Sha256::digest(&b)) == r.sha256,
            };
            if !sum {
                bail!(
                    "{}: expert {} of layer {}: checksum mismatch (the local pack is damaged; `deltafin pack --verify {}` lists what)",
                    self.dir.display(),
                    r.expert,
                    r.layer,
                    self.dir.display()
                );
            }
            let a = start.max(o);
            let z = end.min(o + r.len);
            out[(a - start) as usize..(z - start) as usize]
                .copy_from_slice(&b[(a - o) as usize..(z - o) as usize]);
        }
        Ok(out)
    }
}

impl Source<'_> {
    fn read(&self, start: u64, end: u64) -> Result<Vec<u8>> {
        match self {
            Source::Experts(r) => r.read(start, end),
            Source::File(p) => {
                let mut b = vec![0u8; (end - start) as usize];
                File::open(p)
                    .and_then(|f| f.read_exact_at(&mut b, start))
                    .with_context(|| format!("{}", p.display()))?;
                Ok(b)
            }
        }
    }
}

/// The journal's path for uploading the pack in `dir` to `url`.
fn journal_path(dir: &Path, url: &S3Url) -> PathBuf {
    let h = Sha256::digest(url.to_string().as_bytes());
    dir.join(format!("upload-{}.json", hex(&h[..8])))
}

fn save(p: &Path, j: &Journal) -> Result<()> {
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(j)?)
        .and_then(|()| File::open(&tmp)?.sync_all())
        .with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, p).with_context(|| format!("{}", p.display()))
}

/// Uploads the finished pack in `dir` to `url` (see the module docs).
///
/// Errors: `dir` holds no finished pack or it fails its checks; a record does not match its
/// checksum (naming it); a different pack is at `url` (without
/// [`UploadOptions::overwrite`]); a request fails after its retries (naming the object and
/// part); the journal cannot be written.
pub fn upload_pack(dir: &Path, url: &str, o: &UploadOptions) -> Result<UploadReport> {
    let url = S3Url::parse(url).map_err(anyhow::Error::msg)?;
    let m = Manifest::read_checked(dir)?;
    let rm = remote_manifest(&m, &url)?;
    let text = serde_json::to_string_pretty(&rm)?;
    let sha = hex(&Sha256::digest(text.as_bytes()));
    let remote = Remote::connect(&url, o.fetch.clone())?;
    let mut rep = UploadReport::default();
    match remote.get_small(MANIFEST, crate::source::pack::MAX_MANIFEST_BYTES)? {
        Some(t) if t == text.as_bytes() => {
            rep.already = true;
            return Ok(rep);
        }
        Some(_) if !o.overwrite => bail!(
            "{url}: holds another pack (its {MANIFEST} differs); pass --overwrite to replace it"
        ),
        Some(_) => remote.delete(MANIFEST)?,
        None => {}
    }
    let jp = journal_path(dir, &url);
    let mut j: Journal = std::fs::read(&jp)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|j: &Journal| {
            j.url == url.to_string() && j.manifest_sha256 == sha && j.part_bytes == o.part_bytes
        })
        .unwrap_or_else(|| Journal {
            url: url.to_string(),
            manifest_sha256: sha.clone(),
            part_bytes: o.part_bytes,
            objects: BTreeMap::new(),
        });
    let files = m
        .drives
        .iter()
        .enumerate()
        .map(|(d, x)| File::open(&x.file).with_context(|| m.drive_label(d)))
        .collect::<Result<Vec<_>>>()?;
    let (offs, experts_len) = record_offsets(&m);
    let records = Records {
        m: &m,
        dir,
        files,
        offs,
    };
    let mut objects: Vec<(String, u64, Source)> = vec![
        (
            EXPERTS_OBJECT.into(),
            experts_len,
            Source::Experts(&records),
        ),
        (
            m.spine_file.clone(),
            m.spine_len,
            Source::File(dir.join(&m.spine_file)),
        ),
    ];
    for f in &m.copied_files {
        let p = dir.join(f);
        let b = std::fs::read(&p).with_context(|| format!("{}", p.display()))?;
        if let Some(h) = m.file_sha256.get(f) {
            if &hex(&Sha256::digest(&b)) != h {
                bail!(
                    "{}: checksum mismatch (the file differs from the one packed)",
                    p.display()
                );
            }
        }
        objects.push((f.clone(), b.len() as u64, Source::File(p)));
    }
    let total: u64 = objects.iter().map(|x| x.1).sum();
    let bar = crate::progress::bar(total, "uploading", o.progress);
    let mut sent_parts = 0usize;
    for (name, len, src) in &objects {
        let e = j.objects.entry(name.clone()).or_default().clone();
        if e.done {
            rep.skipped += 1;
            bar.inc(*len);
            continue;
        }
        if *len <= o.part_bytes {
            remote.put(name, src.read(0, *len)?)?;
            j.objects.insert(
                name.clone(),
                ObjectUpload {
                    done: true,
                    ..Default::default()
                },
            );
            save(&jp, &j)?;
            rep.sent += 1;
            rep.bytes += len;
            bar.inc(*len);
            continue;
        }
        let n = len.div_ceil(o.part_bytes) as usize;
        let mut up = e;
        if up.upload_id.is_none() || up.etags.len() != n {
            up = ObjectUpload {
                upload_id: Some(remote.create_multipart(name)?),
                etags: vec![None; n],
                done: false,
            };
            j.objects.insert(name.clone(), up.clone());
            save(&jp, &j)?;
        }
        let id = up.upload_id.clone().expect("set");
        let todo: Vec<usize> = (0..n).filter(|&i| up.etags[i].is_none()).collect();
        rep.skipped += n - todo.len();
        bar.inc((n - todo.len()) as u64 * o.part_bytes);
        for group in todo.chunks(o.fetch.concurrency.max(1)) {
            let mut parts = Vec::new();
            for &i in group {
                let a = i as u64 * o.part_bytes;
                let z = (a + o.part_bytes).min(*len);
                parts.push((i, src.read(a, z)?));
            }
            let client = remote.client.clone();
            let got = remote.block_on(async {
                let mut hs = Vec::new();
                for (i, b) in parts {
                    let (c, nm, id) = (client.clone(), name.clone(), id.clone());
                    let l = b.len() as u64;
                    hs.push(tokio::spawn(async move {
                        c.put_part(&nm, &id, i, b).await.map(|t| (i, t, l))
                    }));
                }
                let mut out = Vec::new();
                for h in hs {
                    out.push(h.await.map_err(std::io::Error::other).and_then(|r| r));
                }
                out
            });
            let mut first_err = None;
            for r in got {
                match r {
                    Ok((i, etag, l)) => {
                        up.etags[i] = Some(etag);
                        rep.sent += 1;
                        rep.bytes += l;
                        sent_parts += 1;
                        bar.inc(l);
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            j.objects.insert(name.clone(), up.clone());
            save(&jp, &j)?;
            if let Some(e) = first_err {
                return Err(anyhow::Error::new(e).context(format!(
                    "{url}: uploading {name} (run the same command again to resume)"
                )));
            }
            if o.stop_after_parts.is_some_and(|s| sent_parts >= s) {
                // as if killed: no cleanup, the journal is what the next run finds
                std::process::exit(137);
            }
        }
        let etags: Vec<String> = up.etags.iter().flatten().cloned().collect();
        remote.complete_multipart(name, &id, &etags)?;
        up.done = true;
        j.objects.insert(name.clone(), up);
        save(&jp, &j)?;
    }
    remote.put(MANIFEST, text.into_bytes())?;
    rep.sent += 1;
    bar.finish_and_clear();
    let _ = std::fs::remove_file(&jp);
    Ok(rep)
}
