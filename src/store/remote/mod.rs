//! Packs on object storage (S3 and the services that speak its API), the part of it that knows
//! nothing of manifests: where a pack lives (`url.rs`: `s3://BUCKET/PREFIX`), the endpoint,
//! region and credentials (`config.rs`: `AWS_*` variables and profile files), the client and
//! its retry policy (`client.rs`, over the `object_store` crate), the fetcher that reads expert
//! records by ranged GETs for the read engine (`fetch.rs`), the local tier that keeps them on
//! a local drive (`tier.rs`), and what an opened remote pack tells the expert store
//! (`spec.rs`). Making the local copy of a remote pack and uploading one, which read
//! manifests, are [`crate::remote`]'s.

pub mod client;
pub mod config;
pub mod fetch;
pub mod spec;
pub mod tier;
pub mod url;

pub use client::{FetchOptions, Remote, RemoteClient};
pub use fetch::{FetchJob, Fetcher};
pub use spec::RemoteSpec;
pub use tier::LocalTier;
pub use url::{is_s3_url, S3Url};
