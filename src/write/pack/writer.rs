//! Writing and resuming a pack: [`write_pack`] runs the plan (`plan.rs`), copies spine tensors
//! and expert records from the source, keeps the journal and writes the manifest last.

use crate::store::checksum::xxh3_128;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::gguf;
use super::guard::{
    check_owned, check_space, copy_small_file, file_matches, lock_out, small_files,
};
use super::hf::hf_source;
use super::input::absolute;
use super::plan::{plan, PackOptions};
use super::records::{read_at, read_record};
use crate::source::hf::is_hf_folder;
use crate::source::pack::{hex, is_pack, Manifest, JOURNAL, MANIFEST, SPINE_FILE};

/// The plan of a pack being written.
const PLAN: &str = "pack.plan.json";

/// What [`write_pack`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackReport {
    /// Expert records and spine tensors written in this run.
    pub written: usize,
    /// Expert records and spine tensors found done (journaled and read back intact).
    pub skipped: usize,
    pub bytes_written: u64,
}

/// Reads the journal: `(kind, index) → checksum`.
fn read_journal(p: &Path) -> HashMap<(char, usize), String> {
    let Ok(text) = std::fs::read_to_string(p) else {
        return HashMap::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.split(' ');
            let k = it.next()?.chars().next()?;
            let i = it.next()?.parse().ok()?;
            let h = it.next()?.to_string();
            (h.len() == 64).then_some(((k, i), h))
        })
        .collect()
}

/// A finished pack's manifest with what writing fills in cleared: what a plan of the same
/// settings and source equals.
fn bare(f: &Manifest) -> Manifest {
    let mut b = f.clone();
    b.tensors.iter_mut().for_each(|t| {
        t.sha256 = None;
        t.xxh3 = None;
    });
    b.experts.iter_mut().for_each(|r| {
        r.sha256.clear();
        r.xxh3 = None;
    });
    b
}

/// Packs the model at `src` (see the module docs): a Hugging Face folder or a GGUF file, split
/// set or folder holding one, of a family the registry packs
/// ([`crate::models::Family::pack_experts`]: Qwen3, Qwen3-MoE, Llama, Mixtral, GPT-OSS,
/// DeepSeek V3 and Kimi K2 today), expert records in their stored encodings (FP8 weights with
/// their `weight_scale_inv`, MXFP4 blocks with their scales).
///
/// Everything that can be checked is checked before the first byte is written: the drives, the
/// source and its configuration (as loading reads it), the lock on `out` (one writer per pack),
/// that no drive file of another pack would be written, and free space. A finished pack in
/// `out` stays loadable until something in it must change: a re-run of the same settings and
/// source finds everything done and changes nothing (a damaged item is rewritten); other
/// settings are refused unless [`PackOptions::overwrite`].
///
/// Errors: the source is itself a pack, cannot be opened, is of another architecture or has a
/// configuration its family refuses; `out` is the source; a drive is not a writable folder;
/// another `pack` writes `out`; a drive file exists that is not this pack's; a file system has
/// too little free space; `out` holds a finished pack of other settings (without
/// `overwrite`); a read or write fails (the message names the file).
pub fn write_pack(src: &Path, o: &PackOptions) -> Result<PackReport> {
    if is_pack(src) {
        bail!("{}: is already a pack", src.display());
    }
    if absolute(src) == absolute(&o.out) {
        bail!("--out must differ from the source model");
    }
    if o.drives.is_empty() {
        bail!("--drives needs at least one path");
    }
    for d in &o.drives {
        if !d.is_dir() {
            bail!("drive {}: not a folder", d.display());
        }
    }
    let source = match is_hf_folder(src) {
        true => hf_source(src)?,
        false => gguf::gguf_source(src)?,
    };
    std::fs::create_dir_all(&o.out).with_context(|| format!("{}", o.out.display()))?;
    let _lock = lock_out(&o.out)?;
    let finished = match is_pack(&o.out) {
        true => Some(Manifest::read(&o.out).with_context(|| {
            format!(
                "{}: holds a pack whose manifest cannot be read (pass --overwrite to replace it)",
                o.out.display()
            )
        })),
        false => None,
    };
    let finished = match (finished, o.overwrite) {
        (Some(Err(_)), true) => None,
        (Some(r), _) => Some(r?),
        (None, _) => None,
    };
    let (mut m, header) = plan(&source, o)?;
    let small = match &source.folder {
        Some(folder) => small_files(folder)?,
        None => Vec::new(),
    };
    m.copied_files = small.iter().map(|f| f.name.clone()).collect();
    m.file_sha256 = small
        .iter()
        .map(|f| (f.name.clone(), f.sha256.clone()))
        .collect();
    let same = finished.as_ref().is_some_and(|f| bare(f) == m);
    if let Some(f) = &finished {
        if !same && !o.overwrite {
            bail!(
                "{}: holds a finished pack made with other settings or from another source (placement {}, {} drives: {}); pass --overwrite to replace it",
                o.out.display(),
                f.placement,
                f.drives.len(),
                f.drives
                    .iter()
                    .map(|d| d.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let plan_text = serde_json::to_string_pretty(&m)?;
    let plan_path = o.out.join(PLAN);
    let journal_path = o.out.join(JOURNAL);
    let old_plan = std::fs::read_to_string(&plan_path).ok();
    // the drive files this pack already owns: its finished manifest's or its plan's
    let mut ours: Vec<String> = Vec::new();
    if let Some(f) = &finished {
        ours.extend(f.drives.iter().map(|d| d.file.clone()));
    }
    if let Some(p) = old_plan
        .as_deref()
        .and_then(|t| serde_json::from_str::<Manifest>(t).ok())
    {
        ours.extend(p.drives.into_iter().map(|d| d.file));
    }
    check_owned(&m, &o.out, &ours)?;
    let copied = small.iter().map(|f| f.len).sum();
    check_space(&m, &o.out, copied, &crate::write::space::free_bytes)?;
    // from here on a finished pack is given up only before the first byte that changes it
    let mut intact = finished.is_some();
    let manifest_path = o.out.join(MANIFEST);
    let unfinish = |intact: &mut bool| -> Result<()> {
        if std::mem::take(intact) {
            std::fs::remove_file(&manifest_path)
                .with_context(|| format!("{}", manifest_path.display()))?;
        }
        Ok(())
    };
    if !same {
        unfinish(&mut intact)?;
    }
    let resume = old_plan.as_deref() == Some(plan_text.as_str());
    if !resume {
        let _ = std::fs::remove_file(&journal_path);
        std::fs::write(&plan_path, &plan_text)
            .with_context(|| format!("{}", plan_path.display()))?;
    }
    let mut journal = read_journal(&journal_path);
    // a finished pack of the same plan: its manifest's checksums serve as the journal
    if let (Some(f), true) = (&finished, same) {
        for (i, t) in f.tensors.iter().enumerate() {
            if let Some(h) = &t.sha256 {
                journal.insert(('s', i), h.clone());
            }
        }
        for (i, r) in f.experts.iter().enumerate() {
            journal.insert(('e', i), r.sha256.clone());
        }
    }
    let mut jf = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&journal_path)
        .with_context(|| format!("{}", journal_path.display()))?;
    let open_rw = |p: &Path, len: u64, intact: &mut bool| -> Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .with_context(|| format!("{}", p.display()))?;
        if f.metadata()?.len() != len {
            unfinish(intact)?;
            f.set_len(len).with_context(|| format!("{}", p.display()))?;
        }
        Ok(f)
    };
    let spine_path = o.out.join(SPINE_FILE);
    let spine = open_rw(&spine_path, m.spine_len, &mut intact)?;
    let drive_files: Vec<File> = m
        .drives
        .iter()
        .map(|d| open_rw(Path::new(&d.file), d.len, &mut intact))
        .collect::<Result<_>>()?;
    let src_files: Vec<File> = source
        .files
        .iter()
        .map(|p| File::open(p).with_context(|| format!("{}", p.display())))
        .collect::<Result<_>>()?;
    let total: u64 = source.tensors.iter().map(|t| t.n_bytes).sum();
    let bar = crate::progress::bar(total, "packing", o.progress);
    let mut rep = PackReport::default();
    let src_names: Vec<String> = source
        .files
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    // spine tensors, in chunks of 64 MiB
    let mut pending = String::new();
    let by_name: HashMap<&str, usize> = source
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    for (ti, pt) in m.tensors.iter_mut().enumerate() {
        if pt.file != 0 {
            continue;
        }
        let st = &source.tensors[by_name[pt.name.as_str()]];
        if let Some(h) = journal.get(&('s', ti)) {
            let mut b = vec![0u8; pt.n_bytes as usize];
            if read_at(&spine, pt.offset, &mut b, &|| {
                spine_path.display().to_string()
            })
            .is_ok()
                && &hex(&Sha256::digest(&b)) == h
            {
                pt.sha256 = Some(h.clone());
                pt.xxh3 = Some(hex(&xxh3_128(&b)));
                rep.skipped += 1;
                bar.inc(pt.n_bytes);
                continue;
            }
        }
        unfinish(&mut intact)?;
        let mut h = Sha256::new();
        let mut x = xxhash_rust::xxh3::Xxh3::new();
        let mut done = 0u64;
        let mut buf = vec![0u8; (pt.n_bytes as usize).min(64 << 20)];
        while done < pt.n_bytes {
            let n = ((pt.n_bytes - done) as usize).min(buf.len());
            read_at(
                &src_files[st.file],
                st.offset + done,
                &mut buf[..n],
                &|| src_names[st.file].clone(),
            )?;
            h.update(&buf[..n]);
            x.update(&buf[..n]);
            spine
                .write_all_at(&buf[..n], pt.offset + done)
                .with_context(|| format!("{}", spine_path.display()))?;
            done += n as u64;
            bar.inc(n as u64);
        }
        let hx = hex(&h.finalize());
        pending.push_str(&format!("s {ti} {hx}\n"));
        pt.sha256 = Some(hx);
        pt.xxh3 = Some(hex(&x.digest128().to_be_bytes()));
        rep.written += 1;
        rep.bytes_written += pt.n_bytes;
    }
    if let Some(h) = &header {
        let mut on_disk = vec![0u8; h.len()];
        let same_header =
            read_at(&spine, 0, &mut on_disk, &|| String::new()).is_ok() && &on_disk == h;
        if !same_header {
            unfinish(&mut intact)?;
            spine
                .write_all_at(h, 0)
                .with_context(|| format!("{}", spine_path.display()))?;
        }
    }
    spine
        .sync_data()
        .with_context(|| format!("{}", spine_path.display()))?;
    journal_append(&mut jf, &mut pending, &journal_path)?;
    pending.clear();
    let spine_written = rep.written;
    // expert records, synced and journaled layer by layer
    let mut by_key: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    for (i, t) in source.tensors.iter().enumerate() {
        if let Some(k) = source.experts.key(&t.name) {
            by_key.entry(k).or_default().push(i);
        }
    }
    let n_rec = m.experts.len();
    for ri in 0..n_rec {
        let r = m.experts[ri].clone();
        if let Some(h) = journal.get(&('e', ri)) {
            if let Ok(b) = read_record(&m, &drive_files, &r) {
                if &hex(&Sha256::digest(&b)) == h {
                    m.experts[ri].sha256 = h.clone();
                    m.experts[ri].xxh3 = Some(hex(&xxh3_128(&b)));
                    rep.skipped += 1;
                    bar.inc(
                        by_key[&(r.layer, r.expert)]
                            .iter()
                            .map(|&i| source.tensors[i].n_bytes)
                            .sum(),
                    );
                    continue;
                }
            }
        }
        unfinish(&mut intact)?;
        let mut rec = vec![0u8; r.len as usize];
        let mut vfile_base = None;
        for &i in &by_key[&(r.layer, r.expert)] {
            let st = &source.tensors[i];
            let pt = &m.tensors[i];
            // the tensor's offset inside the record: its logical offset minus the record's
            let base = *vfile_base.get_or_insert_with(|| record_base(&m, ri));
            let at = (pt.offset - base) as usize;
            read_at(
                &src_files[st.file],
                st.offset,
                &mut rec[at..at + st.n_bytes as usize],
                &|| src_names[st.file].clone(),
            )?;
            bar.inc(st.n_bytes);
        }
        for x in &r.extents {
            let src = &rec[x.record_offset as usize..(x.record_offset + x.len) as usize];
            drive_files[x.drive]
                .write_all_at(src, x.offset)
                .with_context(|| m.drive_label(x.drive))?;
        }
        let hx = hex(&Sha256::digest(&rec));
        pending.push_str(&format!("e {ri} {hx}\n"));
        m.experts[ri].sha256 = hx;
        m.experts[ri].xxh3 = Some(hex(&xxh3_128(&rec)));
        rep.written += 1;
        rep.bytes_written += r.len;
        let layer_done = ri + 1 == n_rec || m.experts[ri + 1].layer != m.experts[ri].layer;
        let stop = o
            .stop_after
            .is_some_and(|n| rep.written - spine_written >= n);
        if (layer_done || stop) && !pending.is_empty() {
            for (d, f) in drive_files.iter().enumerate() {
                f.sync_data().with_context(|| m.drive_label(d))?;
            }
            journal_append(&mut jf, &mut pending, &journal_path)?;
        }
        if stop {
            bail!(
                "packing interrupted after {} expert records",
                rep.written - spine_written
            );
        }
    }
    bar.finish_and_clear();
    // copy the small files (config, tokenizer, generation config) and finish with the manifest
    for f in &small {
        if !(intact && file_matches(&o.out, &f.name, &f.sha256)) {
            unfinish(&mut intact)?;
            copy_small_file(f, &o.out)?;
        }
    }
    if !intact {
        write_manifest(&o.out, &m)?;
    }
    drop(jf);
    let _ = std::fs::remove_file(&journal_path);
    let _ = std::fs::remove_file(&plan_path);
    Ok(rep)
}

/// Appends the `pending` journal lines to `jf` (the journal at `path`) and syncs it.
///
/// Errors: the write or sync fails (the message names the journal).
fn journal_append(jf: &mut File, pending: &mut String, path: &Path) -> Result<()> {
    jf.write_all(pending.as_bytes())
        .and_then(|()| jf.sync_data())
        .with_context(|| format!("{}: writing the journal", path.display()))?;
    pending.clear();
    Ok(())
}

/// Writes `m` as the manifest of the pack in `out`: to `manifest.json.tmp`, synced, then
/// renamed over `manifest.json` (the pack is complete only then).
///
/// Errors: a write, sync or the rename fails, out of space included (the message names the
/// file); the temporary file is removed.
fn write_manifest(out: &Path, m: &Manifest) -> Result<()> {
    let tmp = out.join(format!("{MANIFEST}.tmp"));
    let text = serde_json::to_string_pretty(m)?;
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(anyhow::Error::new(e)
            .context(format!("{}: writing the pack's manifest", tmp.display())));
    }
    let dst = out.join(MANIFEST);
    std::fs::rename(&tmp, &dst)
        .with_context(|| format!("{}: renaming {} over it", dst.display(), tmp.display()))
}

/// The logical offset where record `ri` starts.
fn record_base(m: &Manifest, ri: usize) -> u64 {
    match m.stripe_chunk {
        Some(c) => ri as u64 * c * m.drives.len() as u64,
        None => m.experts[ri].extents[0].offset,
    }
}
