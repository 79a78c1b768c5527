//! Packs on object storage (`s3://BUCKET/PREFIX`), the parts that read manifests: laying a
//! pack out as objects (`layout.rs`), uploading one (`upload.rs`: `pack --out s3://…`,
//! multipart and resumable), and the local copy a run opens (`mirror.rs`: manifest, spine and
//! small files fetched and checked, the expert object mirrored sparsely). The client, the
//! fetcher of expert records and the local tier, which know nothing of manifests, are
//! [`crate::store::remote`]'s. This module imports `source` and `store` and is imported by
//! `cli` only; docs/object-storage.md describes the whole.

pub mod layout;
pub mod mirror;
pub mod upload;

pub use mirror::{copy_dir, local_copy};
pub use upload::{upload_pack, UploadOptions, UploadReport};
