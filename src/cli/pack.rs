//! `deltafin pack`: writes a pack of a Hugging Face folder or a GGUF file across drives, or
//! verifies one (see [`crate::source::pack`] for the format).

use std::path::PathBuf;

use anyhow::{bail, Result};

use super::store_args::StoreArgs;
use crate::write::pack::{verify_pack, write_pack, PackOptions, PackPlacement};

/// `deltafin pack` flags.
#[derive(clap::Args, Debug)]
#[command(after_help = families_help())]
pub struct PackArgs {
    /// The model to pack, only read: a Hugging Face safetensors folder or a GGUF file (the
    /// first part of a split model, or a folder holding one), or ORG/NAME in the Hugging Face
    /// cache, of a family listed below.
    #[arg(short, long, required_unless_present = "verify")]
    pub model: Option<PathBuf>,
    /// The pack folder (manifest, spine, config and tokenizer files; for GGUF the spine file
    /// is a GGUF file holding the metadata and tokenizer); or s3://BUCKET/PREFIX to upload the
    /// finished pack -m names to object storage (docs/object-storage.md).
    #[arg(long, required_unless_present = "verify")]
    pub out: Option<PathBuf>,
    /// Folders, one per drive, that receive the expert data files (comma-separated; not with
    /// --out s3://…).
    #[arg(long, value_delimiter = ',')]
    pub drives: Vec<PathBuf>,
    /// stripe: every expert cut evenly over all drives; spread: whole experts balanced per
    /// layer over the drives, hottest first when a heat file exists.
    #[arg(long, default_value = "stripe")]
    pub placement: PackPlacement,
    /// Heat file to balance `spread` by; default: the one `run` keeps for the model; `none`.
    #[arg(long)]
    pub heat_file: Option<String>,
    /// Replace a finished pack in --out made with other settings or from another source
    /// (without it, `pack` refuses and leaves that pack as it is; a re-run with the same
    /// settings only finishes or repairs the pack).
    #[arg(long)]
    pub overwrite: bool,
    /// Verify the pack in this folder (the manifest against its files, then every checksum:
    /// spine tensors, expert records and copied files) instead of writing one.
    #[arg(long, conflicts_with_all = ["model", "out", "overwrite"])]
    pub verify: Option<PathBuf>,
    /// With --out s3://…: bytes of one part of a multipart upload (S3 takes 5M at least)
    #[arg(long, value_name = "SIZE", default_value = "8M", value_parser = crate::store::plan::parse_size)]
    pub part_size: u64,
    /// With --out s3://…: parts in flight at most, 1 to 4096
    #[arg(long, value_name = "N", default_value_t = crate::store::remote::client::DEFAULT_CONCURRENCY as u64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub s3_concurrency: u64,
    /// Tests: end as if killed once this many parts were sent
    #[arg(long, hide = true)]
    pub stop_after_parts: Option<usize>,
}

/// The end of `pack --help`: every family `pack` packs, from the registry
/// ([`crate::models::FAMILIES`], those with [`crate::models::Family::pack_experts`]), one line
/// each with its `config.json` `model_type`s and GGUF `general.architecture`s.
pub fn families_help() -> String {
    let mut out =
        String::from("Families packed (config.json model_type / GGUF general.architecture):\n");
    for f in crate::models::FAMILIES {
        if f.pack_experts().is_none() {
            continue;
        }
        let list = |names: &[&str]| match names.is_empty() {
            true => "-".to_string(),
            false => names.join(", "),
        };
        out.push_str(&format!(
            "  {:<12} {} / {}\n",
            f.name,
            list(f.model_types),
            list(f.gguf_architectures)
        ));
    }
    out
}

/// Runs `deltafin pack`.
pub fn run(a: PackArgs) -> Result<()> {
    if let Some(dir) = &a.verify {
        let (n, bad) = verify_pack(dir)?;
        for b in &bad {
            eprintln!("{b}");
        }
        if !bad.is_empty() {
            bail!(
                "{}: {} of {n} checksums do not match",
                dir.display(),
                bad.len()
            );
        }
        outln!("{}: all {n} checksums match", dir.display());
        return Ok(());
    }
    let (Some(model), Some(out)) = (super::model_path(a.model.as_deref())?, a.out.clone()) else {
        bail!("pack needs -m MODEL and --out DIR");
    };
    if let Some(url) = out.to_str().filter(|u| crate::store::remote::is_s3_url(u)) {
        return upload(&model, url, &a);
    }
    if a.drives.is_empty() {
        bail!("pack needs --drives DIR[,DIR...] (the folders that receive the expert data files)");
    }
    let heat = StoreArgs::heat_path_for(a.heat_file.as_deref(), Some(&model));
    let rep = write_pack(
        &model,
        &PackOptions {
            out: out.clone(),
            drives: a.drives,
            placement: a.placement,
            heat_file: heat,
            progress: true,
            overwrite: a.overwrite,
            stop_after: None,
        },
    )?;
    outln!(
        "{}: {} items written ({:.1} MiB), {} already done",
        out.display(),
        rep.written,
        rep.bytes_written as f64 / 1048576.0,
        rep.skipped
    );
    Ok(())
}

/// `pack -m PACK --out s3://…`: uploads the finished pack `pack` to `url`.
///
/// Errors: `pack` is not a finished pack (packing a model to object storage goes through a
/// local pack first), `--drives` was given, or the upload fails (as
/// [`crate::remote::upload_pack`]).
fn upload(pack: &std::path::Path, url: &str, a: &PackArgs) -> Result<()> {
    use crate::remote::{upload_pack, UploadOptions};
    if !crate::source::pack::is_pack(pack) {
        bail!(
            "{}: not a finished pack; pack the model to a local folder first (`deltafin pack -m MODEL --out DIR --drives ...`), then upload that folder with `deltafin pack -m DIR --out {url}`",
            pack.display()
        );
    }
    if !a.drives.is_empty() {
        bail!(
            "--drives does not apply to an upload to {url} (the pack's records become one object)"
        );
    }
    let rep = upload_pack(
        pack,
        url,
        &UploadOptions {
            part_bytes: a.part_size.max(1),
            fetch: crate::store::remote::FetchOptions {
                concurrency: a.s3_concurrency as usize,
                ..Default::default()
            },
            overwrite: a.overwrite,
            progress: true,
            stop_after_parts: a.stop_after_parts,
        },
    )?;
    match rep.already {
        true => outln!(
            "{url}: already uploaded (its manifest matches {})",
            pack.display()
        ),
        false => outln!(
            "{url}: {} objects and parts sent ({:.1} MiB), {} already done",
            rep.sent,
            rep.bytes as f64 / 1048576.0,
            rep.skipped
        ),
    }
    Ok(())
}
