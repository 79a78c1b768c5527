//! Writing and verifying packs (layout in [`super::pack`]).
//!
//! [`write_pack`] plans the whole layout first (spine offsets, each expert's record and its
//! extents on the drives) and keeps that plan in `pack.plan.json`; a later run with the same
//! plan resumes: records listed in `pack.journal` whose bytes read back with the journaled
//! checksum are skipped. Data files are synced before their records enter the journal, and
//! `manifest.json` is written last, by rename, so an unfinished pack is never loadable. The
//! source is only ever read.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use super::hf::HfModel;
use super::pack::{
    hex, Drive, ExpertRecord, Extent, Manifest, PackTensor, SourceIdentity, FORMAT_VERSION,
    JOURNAL, MANIFEST, SPINE_FILE,
};
use crate::store::aligned::round_up;
use crate::store::heat::Heat;

const ALIGN: u64 = 4096;
/// The plan of a pack being written.
const PLAN: &str = "pack.plan.json";

/// How expert records are placed on the drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PackPlacement {
    /// Every record cut into equal 4 KiB-multiple chunks, one per drive.
    Stripe,
    /// Whole records, each layer's experts dealt evenly over the drives (hottest first).
    Spread,
}

/// Options of [`write_pack`].
#[derive(Clone, Debug)]
pub struct PackOptions {
    pub out: PathBuf,
    pub drives: Vec<PathBuf>,
    pub placement: PackPlacement,
    /// Per-(layer, expert) use counts to balance `spread` by (missing file: none).
    pub heat_file: Option<PathBuf>,
    /// Show a progress bar on standard error.
    pub progress: bool,
    /// Stop with an error after writing this many expert records in this run, as an
    /// interruption would (for tests of resuming); `None` in normal use.
    pub stop_after: Option<usize>,
}

/// What [`write_pack`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackReport {
    /// Expert records and spine tensors written in this run.
    pub written: usize,
    /// Expert records and spine tensors found done (journaled and read back intact).
    pub skipped: usize,
    pub bytes_written: u64,
}

/// The (layer, expert) of a Hugging Face routed-expert tensor name
/// (`model.layers.L.….experts.E.NAME`), else `None`.
fn expert_key(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let i = rest.find("experts.")?;
    let (e, _) = rest[i + "experts.".len()..].split_once('.')?;
    Some((l.parse().ok()?, e.parse().ok()?))
}

/// Order of a tensor inside its record: gate, up, down, then the rest by name.
fn role(name: &str) -> u8 {
    if name.contains("gate_proj") || name.contains(".w1.") {
        0
    } else if name.contains("up_proj") || name.contains(".w3.") {
        1
    } else if name.contains("down_proj") || name.contains(".w2.") {
        2
    } else {
        3
    }
}

/// SHA-256 over `config.json` and every safetensors header (8-byte length and JSON).
fn source_hash(hf: &HfModel) -> Result<String> {
    let mut h = Sha256::new();
    h.update(std::fs::read(hf.config_path())?);
    for p in &hf.files {
        let mut f = File::open(p).with_context(|| format!("{}", p.display()))?;
        let mut n = [0u8; 8];
        f.read_exact(&mut n)
            .with_context(|| format!("{}", p.display()))?;
        let len = u64::from_le_bytes(n).min(100 << 20);
        let mut head = vec![0u8; len as usize];
        f.read_exact(&mut head)
            .with_context(|| format!("{}", p.display()))?;
        h.update(n);
        h.update(&head);
    }
    Ok(hex(&h.finalize()))
}

/// The data file of drive `d` for the pack `out`.
fn drive_file(drive: &Path, out: &Path, d: usize) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pack".into());
    drive.join(format!("deltafin-pack-{name}-{d}.bin"))
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// One record's key (layer, expert), its tensors (index, offset in the record) and its length.
type RecordLayout = ((usize, usize), Vec<(usize, u64)>, u64);

/// Plans the pack of `hf` under `o`: the manifest without checksums.
fn plan(hf: &HfModel, src: &Path, o: &PackOptions) -> Result<Manifest> {
    let nd = o.drives.len();
    if nd == 0 {
        bail!("--drives needs at least one path");
    }
    let mut spine_tensors = Vec::new();
    let mut records: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (i, t) in hf.tensors.iter().enumerate() {
        match expert_key(&t.name) {
            Some(k) => records.entry(k).or_default().push(i),
            None => spine_tensors.push(i),
        }
    }
    let mut tensors: Vec<Option<PackTensor>> = vec![None; hf.tensors.len()];
    let entry = |i: usize, file: usize, offset: u64| {
        let t = &hf.tensors[i];
        PackTensor {
            name: t.name.clone(),
            dtype: t.ty.name().to_string(),
            ggml_type: t.ty.id(),
            shape: t.shape.clone(),
            file,
            offset,
            n_bytes: t.n_bytes,
            sha256: None,
        }
    };
    let mut spine_len = 0u64;
    for &i in &spine_tensors {
        tensors[i] = Some(entry(i, 0, spine_len));
        spine_len = round_up((spine_len + hf.tensors[i].n_bytes) as usize, ALIGN as usize) as u64;
    }
    // each record's tensors (role order) and their offsets inside it
    let mut layout: Vec<RecordLayout> = Vec::new();
    for (k, mut ids) in records {
        ids.sort_by_key(|&i| (role(&hf.tensors[i].name), hf.tensors[i].name.clone()));
        let mut off = 0u64;
        let mut end = 0u64;
        let mut placed = Vec::new();
        for i in ids {
            placed.push((i, off));
            end = off + hf.tensors[i].n_bytes;
            off = round_up(end as usize, ALIGN as usize) as u64;
        }
        layout.push((k, placed, end));
    }
    let max_len = layout.iter().map(|r| r.2).max().unwrap_or(0);
    let mut drive_len = vec![0u64; nd];
    let mut experts = Vec::with_capacity(layout.len());
    let stripe_chunk = match o.placement {
        PackPlacement::Stripe => {
            let chunk =
                round_up(max_len.div_ceil(nd as u64).max(1) as usize, ALIGN as usize) as u64;
            for (r, (k, placed, len)) in layout.iter().enumerate() {
                let base = r as u64 * chunk * nd as u64;
                for &(i, off) in placed {
                    tensors[i] = Some(entry(i, nd + 1, base + off));
                }
                let mut extents = Vec::new();
                for (d, dl) in drive_len.iter_mut().enumerate() {
                    let from = d as u64 * chunk;
                    if from >= *len {
                        break;
                    }
                    let n = chunk.min(len - from);
                    extents.push(Extent {
                        drive: d,
                        offset: r as u64 * chunk,
                        len: n,
                        record_offset: from,
                    });
                    *dl = (*dl).max(r as u64 * chunk + n);
                }
                experts.push(ExpertRecord {
                    layer: k.0,
                    expert: k.1,
                    len: *len,
                    extents,
                    sha256: String::new(),
                });
            }
            Some(chunk)
        }
        PackPlacement::Spread => {
            let n_layers = layout.iter().map(|r| r.0 .0 + 1).max().unwrap_or(0);
            let n_exp = layout.iter().map(|r| r.0 .1 + 1).max().unwrap_or(0);
            let heat = o
                .heat_file
                .as_ref()
                .map(|p| Heat::load(p, n_layers, n_exp))
                .unwrap_or_else(|| Heat::zeros(n_layers, n_exp));
            // per layer: experts hottest first (ties by id), dealt in snake order 0..D, D..0
            let mut drive_of: HashMap<(usize, usize), usize> = HashMap::new();
            for l in 0..n_layers {
                let mut es: Vec<usize> = layout
                    .iter()
                    .filter(|r| r.0 .0 == l)
                    .map(|r| r.0 .1)
                    .collect();
                es.sort_by_key(|&e| (std::cmp::Reverse(heat.counts[l][e]), e));
                for (j, e) in es.into_iter().enumerate() {
                    let (round, pos) = (j / nd, j % nd);
                    let d = if round % 2 == 0 { pos } else { nd - 1 - pos };
                    drive_of.insert((l, e), d);
                }
            }
            for (k, placed, len) in &layout {
                let d = drive_of[k];
                let base = drive_len[d];
                for &(i, off) in placed {
                    tensors[i] = Some(entry(i, 1 + d, base + off));
                }
                drive_len[d] = base + round_up(*len as usize, ALIGN as usize) as u64;
                experts.push(ExpertRecord {
                    layer: k.0,
                    expert: k.1,
                    len: *len,
                    extents: vec![Extent {
                        drive: d,
                        offset: base,
                        len: *len,
                        record_offset: 0,
                    }],
                    sha256: String::new(),
                });
            }
            None
        }
    };
    let out = absolute(&o.out);
    let drives = o
        .drives
        .iter()
        .zip(&drive_len)
        .enumerate()
        .map(|(d, (p, &len))| {
            let p = absolute(p);
            Drive {
                file: drive_file(&p, &out, d).display().to_string(),
                path: p.display().to_string(),
                len,
            }
        })
        .collect();
    let model_type = hf.model_type()?.to_string();
    Ok(Manifest {
        format_version: FORMAT_VERSION,
        source: SourceIdentity {
            path: absolute(src).display().to_string(),
            format: "hf".into(),
            architecture: model_type,
            headers_sha256: source_hash(hf)?,
        },
        placement: match o.placement {
            PackPlacement::Stripe => "stripe",
            PackPlacement::Spread => "spread",
        }
        .into(),
        stripe_chunk,
        config: hf.config.clone(),
        copied_files: Vec::new(),
        spine_file: SPINE_FILE.into(),
        spine_len,
        drives,
        tensors: tensors
            .into_iter()
            .map(|t| t.expect("every tensor placed"))
            .collect(),
        experts,
    })
}

/// Reads `len` bytes at `offset` of `f` into `out` (error names `label`).
fn read_at(f: &File, offset: u64, out: &mut [u8], label: &dyn Fn() -> String) -> Result<()> {
    f.read_exact_at(out, offset).with_context(|| {
        format!(
            "{}: reading {} bytes at offset {offset}",
            label(),
            out.len()
        )
    })
}

/// The record of expert `r` as stored in the pack (its `len` bytes).
fn read_record(m: &Manifest, files: &[File], r: &ExpertRecord) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; r.len as usize];
    for x in &r.extents {
        let dst = &mut buf[x.record_offset as usize..(x.record_offset + x.len) as usize];
        read_at(&files[x.drive], x.offset, dst, &|| m.drive_label(x.drive))?;
    }
    Ok(buf)
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

/// Packs the Hugging Face model at `src` (see the module docs).
///
/// Errors: the source is not a Hugging Face folder or is itself a pack, `out` is the source, a
/// drive is not a writable folder, a read or write fails (the message names the file).
pub fn write_pack(src: &Path, o: &PackOptions) -> Result<PackReport> {
    if super::pack::is_pack(src) {
        bail!("{}: is already a pack", src.display());
    }
    if absolute(src) == absolute(&o.out) {
        bail!("--out must differ from the source model folder");
    }
    let hf = HfModel::open(src)?;
    let mt = hf.model_type()?;
    if !matches!(mt, "qwen3" | "qwen3_moe" | "llama" | "mixtral") {
        bail!(
            "{}: packing model_type '{mt}' is not supported yet (supported: qwen3, qwen3_moe, llama, mixtral)",
            src.display()
        );
    }
    std::fs::create_dir_all(&o.out).with_context(|| format!("{}", o.out.display()))?;
    let finished = Manifest::read(&o.out).ok();
    let _ = std::fs::remove_file(o.out.join(MANIFEST));
    for d in &o.drives {
        if !d.is_dir() {
            bail!("drive {}: not a folder", d.display());
        }
    }
    let mut m = plan(&hf, src, o)?;
    let plan_text = serde_json::to_string_pretty(&m)?;
    let plan_path = o.out.join(PLAN);
    let journal_path = o.out.join(JOURNAL);
    let resume = std::fs::read_to_string(&plan_path).ok().as_deref() == Some(plan_text.as_str());
    if !resume {
        let _ = std::fs::remove_file(&journal_path);
        std::fs::write(&plan_path, &plan_text)
            .with_context(|| format!("{}", plan_path.display()))?;
    }
    let mut journal = read_journal(&journal_path);
    // a finished pack of the same plan: its manifest's checksums serve as the journal
    if let Some(f) = finished {
        let mut bare = f.clone();
        bare.copied_files.clear();
        bare.tensors.iter_mut().for_each(|t| t.sha256 = None);
        bare.experts.iter_mut().for_each(|r| r.sha256.clear());
        if bare == m {
            for (i, t) in f.tensors.iter().enumerate() {
                if let Some(h) = &t.sha256 {
                    journal.insert(('s', i), h.clone());
                }
            }
            for (i, r) in f.experts.iter().enumerate() {
                journal.insert(('e', i), r.sha256.clone());
            }
        }
    }
    let mut jf = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&journal_path)
        .with_context(|| format!("{}", journal_path.display()))?;
    let open_rw = |p: &Path, len: u64| -> Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .with_context(|| format!("{}", p.display()))?;
        if f.metadata()?.len() != len {
            f.set_len(len).with_context(|| format!("{}", p.display()))?;
        }
        Ok(f)
    };
    let spine_path = o.out.join(SPINE_FILE);
    let spine = open_rw(&spine_path, m.spine_len)?;
    let drive_files: Vec<File> = m
        .drives
        .iter()
        .map(|d| open_rw(Path::new(&d.file), d.len))
        .collect::<Result<_>>()?;
    let src_files: Vec<File> = hf
        .files
        .iter()
        .map(|p| File::open(p).with_context(|| format!("{}", p.display())))
        .collect::<Result<_>>()?;
    let total: u64 = hf.tensors.iter().map(|t| t.n_bytes).sum();
    let bar = if o.progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        b.set_message("packing");
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut rep = PackReport::default();
    let src_names: Vec<String> = hf.files.iter().map(|p| p.display().to_string()).collect();
    // spine tensors, in chunks of 64 MiB
    let mut pending = String::new();
    let by_name: HashMap<&str, usize> = hf
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    for (ti, pt) in m.tensors.iter_mut().enumerate() {
        if pt.file != 0 {
            continue;
        }
        let st = &hf.tensors[by_name[pt.name.as_str()]];
        if let Some(h) = journal.get(&('s', ti)) {
            let mut b = vec![0u8; pt.n_bytes as usize];
            if read_at(&spine, pt.offset, &mut b, &|| {
                spine_path.display().to_string()
            })
            .is_ok()
                && &hex(&Sha256::digest(&b)) == h
            {
                pt.sha256 = Some(h.clone());
                rep.skipped += 1;
                bar.inc(pt.n_bytes);
                continue;
            }
        }
        let mut h = Sha256::new();
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
            spine
                .write_all_at(&buf[..n], pt.offset + done)
                .with_context(|| format!("{}", spine_path.display()))?;
            done += n as u64;
            bar.inc(n as u64);
        }
        let hx = hex(&h.finalize());
        pending.push_str(&format!("s {ti} {hx}\n"));
        pt.sha256 = Some(hx);
        rep.written += 1;
        rep.bytes_written += pt.n_bytes;
    }
    spine.sync_data()?;
    jf.write_all(pending.as_bytes())?;
    jf.sync_data()?;
    pending.clear();
    let spine_written = rep.written;
    // expert records, synced and journaled layer by layer
    let mut by_key: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    for (i, t) in hf.tensors.iter().enumerate() {
        if let Some(k) = expert_key(&t.name) {
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
                    rep.skipped += 1;
                    bar.inc(
                        by_key[&(r.layer, r.expert)]
                            .iter()
                            .map(|&i| hf.tensors[i].n_bytes)
                            .sum(),
                    );
                    continue;
                }
            }
        }
        let mut rec = vec![0u8; r.len as usize];
        let mut vfile_base = None;
        for &i in &by_key[&(r.layer, r.expert)] {
            let st = &hf.tensors[i];
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
        rep.written += 1;
        rep.bytes_written += r.len;
        let layer_done = ri + 1 == n_rec || m.experts[ri + 1].layer != m.experts[ri].layer;
        let stop = o
            .stop_after
            .is_some_and(|n| rep.written - spine_written >= n);
        if (layer_done || stop) && !pending.is_empty() {
            for f in &drive_files {
                f.sync_data()?;
            }
            jf.write_all(pending.as_bytes())?;
            jf.sync_data()?;
            pending.clear();
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
    let mut copied = Vec::new();
    for e in std::fs::read_dir(src).with_context(|| format!("{}", src.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ft = e.file_type()?;
        if !ft.is_file() || name.ends_with(".safetensors") || name == "model.safetensors.index.json"
        {
            continue;
        }
        if e.metadata()?.len() > 64 << 20 {
            continue;
        }
        std::fs::copy(e.path(), o.out.join(&name))
            .with_context(|| format!("copying {}", e.path().display()))?;
        copied.push(name);
    }
    copied.sort();
    m.copied_files = copied;
    let tmp = o.out.join(format!("{MANIFEST}.tmp"));
    {
        let mut f = File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
        f.write_all(serde_json::to_string_pretty(&m)?.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, o.out.join(MANIFEST))
        .with_context(|| format!("{}", o.out.join(MANIFEST).display()))?;
    let _ = std::fs::remove_file(&journal_path);
    let _ = std::fs::remove_file(&plan_path);
    Ok(rep)
}

/// The logical offset where record `ri` starts.
fn record_base(m: &Manifest, ri: usize) -> u64 {
    match m.stripe_chunk {
        Some(c) => ri as u64 * c * m.drives.len() as u64,
        None => m.experts[ri].extents[0].offset,
    }
}

/// A problem [`verify_pack`] found.
pub type Mismatch = String;

/// Checks every spine tensor and expert record of the pack in `dir` against its checksum.
/// Returns the number of items checked and one line per mismatch or unreadable item (naming
/// the drive, file and (layer, expert), or the spine tensor).
///
/// Errors: the manifest cannot be read, a file cannot be opened.
pub fn verify_pack(dir: &Path) -> Result<(usize, Vec<Mismatch>)> {
    let m = Manifest::read(dir)?;
    let spine_path = dir.join(&m.spine_file);
    let spine = File::open(&spine_path).with_context(|| format!("{}", spine_path.display()))?;
    let mut bad = Vec::new();
    let mut n = 0;
    for t in m.tensors.iter().filter(|t| t.file == 0) {
        n += 1;
        let mut b = vec![0u8; t.n_bytes as usize];
        let ok = read_at(&spine, t.offset, &mut b, &|| {
            spine_path.display().to_string()
        })
        .map(|_| Some(hex(&Sha256::digest(&b))) == t.sha256);
        match ok {
            Ok(true) => {}
            Ok(false) => bad.push(format!(
                "{}: spine tensor '{}': checksum mismatch",
                spine_path.display(),
                t.name
            )),
            Err(e) => bad.push(format!("spine tensor '{}': {e:#}", t.name)),
        }
    }
    let files: Vec<File> = m
        .drives
        .iter()
        .enumerate()
        .map(|(d, x)| File::open(&x.file).map_err(|e| anyhow!("{}: {e}", m.drive_label(d))))
        .collect::<Result<_>>()?;
    for r in &m.experts {
        n += 1;
        let where_ = || {
            let ds: Vec<String> = r.extents.iter().map(|x| m.drive_label(x.drive)).collect();
            format!(
                "expert {} of layer {} on {}",
                r.expert,
                r.layer,
                ds.join("; ")
            )
        };
        match read_record(&m, &files, r) {
            Ok(b) if hex(&Sha256::digest(&b)) == r.sha256 => {}
            Ok(_) => bad.push(format!("{}: checksum mismatch", where_())),
            Err(e) => bad.push(format!("{}: {e:#}", where_())),
        }
    }
    Ok((n, bad))
}
