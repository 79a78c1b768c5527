//! Writing and verifying packs (layout in [`super::pack`]).
//!
//! [`write_pack`] plans the whole layout first (spine offsets, each expert's record and its
//! extents on the drives) and keeps that plan in `pack.plan.json`; a later run with the same
//! plan resumes: records listed in `pack.journal` whose bytes read back with the journaled
//! checksum are skipped. Data files are synced before their records enter the journal, and
//! `manifest.json` is written last, by rename, so an unfinished pack is never loadable. The
//! source is only ever read. Hugging Face folders and GGUF files are packed by the same code
//! over one description of the source (its files and tensor index); what is particular to GGUF
//! lives in `pack_gguf.rs`.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::gguf::{GgufModel, TensorInfo};
use super::hf::{is_hf_folder, HfModel};
use super::pack::{
    hex, Drive, ExpertRecord, Extent, Manifest, PackTensor, SourceIdentity, FORMAT_VERSION,
    JOURNAL, MANIFEST, SPINE_FILE,
};
use super::pack_gguf;
pub use super::pack_verify::{verify_pack, Mismatch};
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

/// A model to pack, whatever its format: what the manifest records of it, its files and its
/// tensor index.
pub(super) struct PackSource {
    pub identity: SourceIdentity,
    /// What the manifest keeps as `config`.
    pub config: serde_json::Value,
    pub files: Vec<PathBuf>,
    /// Every tensor; GGUF stacked experts are listed per expert (`NAME[E]`).
    pub tensors: Vec<TensorInfo>,
    /// GGUF sources: the model whose metadata heads the spine file.
    pub gguf: Option<GgufModel>,
    /// Hugging Face sources: the folder whose small files (config, tokenizer) are copied.
    pub folder: Option<PathBuf>,
}

/// The (layer, expert) of a routed-expert tensor name, else `None`: Hugging Face
/// `model.layers.L.….experts.E.NAME`, or a GGUF expert slice `blk.L.ffn_*_exps.weight[E]`.
fn expert_key(name: &str) -> Option<(usize, usize)> {
    if let Some(rest) = name.strip_prefix("blk.") {
        let (l, rest) = rest.split_once('.')?;
        let (t, e) = rest.strip_suffix(']')?.split_once('[')?;
        return t
            .contains("_exps.")
            .then_some((l.parse().ok()?, e.parse().ok()?));
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let i = rest.find("experts.")?;
    let (e, _) = rest[i + "experts.".len()..].split_once('.')?;
    Some((l.parse().ok()?, e.parse().ok()?))
}

/// Order of a tensor inside its record: gate, up, down, then the rest by name.
fn role(name: &str) -> u8 {
    let has = |xs: [&str; 3]| xs.iter().any(|x| name.contains(x));
    if has(["gate_proj", ".w1.", "_gate_exps."]) {
        0
    } else if has(["up_proj", ".w3.", "_up_exps."]) {
        1
    } else if has(["down_proj", ".w2.", "_down_exps."]) {
        2
    } else {
        3
    }
}

/// The Hugging Face folder `src` as a [`PackSource`].
///
/// Errors: the folder cannot be opened ([`HfModel::open`]), its `model_type` cannot be packed.
fn hf_source(src: &Path) -> Result<PackSource> {
    let hf = HfModel::open(src)?;
    let mt = hf.model_type()?;
    if !matches!(mt, "qwen3" | "qwen3_moe" | "llama" | "mixtral") {
        bail!(
            "{}: packing model_type '{mt}' is not supported yet (supported: qwen3, qwen3_moe, llama, mixtral)",
            src.display()
        );
    }
    Ok(PackSource {
        identity: SourceIdentity {
            path: absolute(src).display().to_string(),
            format: "hf".into(),
            architecture: mt.to_string(),
            headers_sha256: source_hash(&hf)?,
        },
        config: hf.config.clone(),
        files: hf.files.clone(),
        tensors: hf.tensors.clone(),
        gguf: None,
        folder: Some(src.to_path_buf()),
    })
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

pub(super) fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// One record's key (layer, expert), its tensors (index, offset in the record) and its length.
type RecordLayout = ((usize, usize), Vec<(usize, u64)>, u64);

/// Plans the pack of `src` under `o`: the manifest without checksums, and for a GGUF source
/// the GGUF header that starts the spine file.
fn plan(src: &PackSource, o: &PackOptions) -> Result<(Manifest, Option<Vec<u8>>)> {
    let nd = o.drives.len();
    if nd == 0 {
        bail!("--drives needs at least one path");
    }
    let mut spine_tensors = Vec::new();
    let mut records: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (i, t) in src.tensors.iter().enumerate() {
        match expert_key(&t.name) {
            Some(k) => records.entry(k).or_default().push(i),
            None => spine_tensors.push(i),
        }
    }
    let mut tensors: Vec<Option<PackTensor>> = vec![None; src.tensors.len()];
    let entry = |i: usize, file: usize, offset: u64| {
        let t = &src.tensors[i];
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
    // a GGUF source's spine file starts with its GGUF header
    let (mut spine_len, spine_align) = match &src.gguf {
        Some(g) => {
            let a = ALIGN.max(g.alignment);
            let list: Vec<&TensorInfo> = spine_tensors.iter().map(|&i| &src.tensors[i]).collect();
            (pack_gguf::header_len(g, &list).next_multiple_of(a), a)
        }
        None => (0, ALIGN),
    };
    for &i in &spine_tensors {
        tensors[i] = Some(entry(i, 0, spine_len));
        spine_len = (spine_len + src.tensors[i].n_bytes).next_multiple_of(spine_align);
    }
    // each record's tensors (role order) and their offsets inside it
    let mut layout: Vec<RecordLayout> = Vec::new();
    for (k, mut ids) in records {
        ids.sort_by_key(|&i| (role(&src.tensors[i].name), src.tensors[i].name.clone()));
        let mut off = 0u64;
        let mut end = 0u64;
        let mut placed = Vec::new();
        for i in ids {
            placed.push((i, off));
            end = off + src.tensors[i].n_bytes;
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
    let tensors: Vec<PackTensor> = tensors
        .into_iter()
        .map(|t| t.expect("every tensor placed"))
        .collect();
    let header = src
        .gguf
        .as_ref()
        .map(|g| pack_gguf::spine_header(g, &tensors))
        .transpose()?;
    let spine_header = header.as_ref().map(|h| super::pack::SpineHeader {
        len: h.len() as u64,
        sha256: hex(&Sha256::digest(h)),
    });
    let m = Manifest {
        format_version: FORMAT_VERSION,
        source: src.identity.clone(),
        placement: match o.placement {
            PackPlacement::Stripe => "stripe",
            PackPlacement::Spread => "spread",
        }
        .into(),
        stripe_chunk,
        config: src.config.clone(),
        copied_files: Vec::new(),
        spine_file: SPINE_FILE.into(),
        spine_len,
        spine_header,
        drives,
        tensors,
        experts,
    };
    Ok((m, header))
}

/// Reads `len` bytes at `offset` of `f` into `out` (error names `label`).
pub(super) fn read_at(
    f: &File,
    offset: u64,
    out: &mut [u8],
    label: &dyn Fn() -> String,
) -> Result<()> {
    f.read_exact_at(out, offset).with_context(|| {
        format!(
            "{}: reading {} bytes at offset {offset}",
            label(),
            out.len()
        )
    })
}

/// The record of expert `r` as stored in the pack (its `len` bytes).
pub(super) fn read_record(m: &Manifest, files: &[File], r: &ExpertRecord) -> Result<Vec<u8>> {
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

/// Packs the model at `src` (see the module docs): a Hugging Face folder (`model_type`
/// `qwen3`, `qwen3_moe`, `llama` or `mixtral`) or a GGUF file, split set or folder holding one
/// (`general.architecture` `qwen3moe`, `qwen3` or `llama`, Mixtral included).
///
/// Errors: the source is itself a pack, cannot be opened, or is of another architecture;
/// `out` is the source; a drive is not a writable folder; a read or write fails (the message
/// names the file).
pub fn write_pack(src: &Path, o: &PackOptions) -> Result<PackReport> {
    if super::pack::is_pack(src) {
        bail!("{}: is already a pack", src.display());
    }
    if absolute(src) == absolute(&o.out) {
        bail!("--out must differ from the source model");
    }
    let source = match is_hf_folder(src) {
        true => hf_source(src)?,
        false => pack_gguf::gguf_source(src)?,
    };
    std::fs::create_dir_all(&o.out).with_context(|| format!("{}", o.out.display()))?;
    let finished = Manifest::read(&o.out).ok();
    let _ = std::fs::remove_file(o.out.join(MANIFEST));
    for d in &o.drives {
        if !d.is_dir() {
            bail!("drive {}: not a folder", d.display());
        }
    }
    let (mut m, header) = plan(&source, o)?;
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
    let src_files: Vec<File> = source
        .files
        .iter()
        .map(|p| File::open(p).with_context(|| format!("{}", p.display())))
        .collect::<Result<_>>()?;
    let total: u64 = source.tensors.iter().map(|t| t.n_bytes).sum();
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
    if let Some(h) = &header {
        spine
            .write_all_at(h, 0)
            .with_context(|| format!("{}", spine_path.display()))?;
    }
    spine.sync_data()?;
    jf.write_all(pending.as_bytes())?;
    jf.sync_data()?;
    pending.clear();
    let spine_written = rep.written;
    // expert records, synced and journaled layer by layer
    let mut by_key: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    for (i, t) in source.tensors.iter().enumerate() {
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
                            .map(|&i| source.tensors[i].n_bytes)
                            .sum(),
                    );
                    continue;
                }
            }
        }
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
    if let Some(folder) = &source.folder {
        m.copied_files = copy_small_files(folder, &o.out)?;
    }
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

/// Copies the small files of the Hugging Face folder `src` (config, tokenizer, generation
/// config: every plain file of at most 64 MiB but the safetensors and their index) into `out`;
/// returns their names, sorted.
///
/// Errors: a file cannot be listed or copied (the message names it).
fn copy_small_files(src: &Path, out: &Path) -> Result<Vec<String>> {
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
        std::fs::copy(e.path(), out.join(&name))
            .with_context(|| format!("copying {}", e.path().display()))?;
        copied.push(name);
    }
    copied.sort();
    Ok(copied)
}

/// The logical offset where record `ri` starts.
fn record_base(m: &Manifest, ri: usize) -> u64 {
    match m.stripe_chunk {
        Some(c) => ri as u64 * c * m.drives.len() as u64,
        None => m.experts[ri].extents[0].offset,
    }
}
