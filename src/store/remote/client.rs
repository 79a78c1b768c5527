//! The object storage client: an `object_store` S3 client on a small tokio runtime of its
//! own, with Deltafin's retry policy for ranged GETs (a GET that fails, times out, returns
//! short or, when a check is given, returns bytes that fail it, is tried again after a
//! doubling backoff, then reported naming the object's URL and byte range), whole small
//! objects, puts and the multipart calls an upload needs. `object_store`'s own retries are
//! off, so that the policy and its counter are these.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjPath;
use object_store::{ClientOptions, ObjectStoreExt, RetryConfig};

use super::config::S3Settings;
use super::url::S3Url;

/// How GETs are run (`--s3-concurrency`, `--s3-timeout`, `--s3-retries`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchOptions {
    /// Expert GETs in flight at most.
    pub concurrency: usize,
    /// Time one request may take, connecting included.
    pub timeout: Duration,
    /// Tries after the first before a GET is reported.
    pub retries: u32,
    /// Wait before the first retry; it doubles for each next one.
    pub backoff: Duration,
}

/// A check of fetched bytes (a record's checksum).
pub type ByteCheck = dyn Fn(&[u8]) -> bool + Sync;

/// Default expert GETs in flight (see BENCHMARKS.md, "Packs on object storage").
pub const DEFAULT_CONCURRENCY: usize = 16;

impl Default for FetchOptions {
    fn default() -> Self {
        Self {
            concurrency: DEFAULT_CONCURRENCY,
            timeout: Duration::from_secs(30),
            retries: 4,
            backoff: Duration::from_millis(100),
        }
    }
}

/// A client of one bucket, for the objects under one prefix (its calls are async; [`Remote`]
/// runs them).
pub struct RemoteClient {
    store: Arc<AmazonS3>,
    /// Where the pack lives.
    pub url: S3Url,
    /// The retry policy and concurrency.
    pub opts: FetchOptions,
    retries: AtomicU64,
}

/// A [`RemoteClient`] with the tokio runtime its calls run on (two worker threads), and
/// blocking forms of the calls for callers outside the runtime.
pub struct Remote {
    pub client: Arc<RemoteClient>,
    rt: tokio::runtime::Runtime,
}

impl RemoteClient {
    /// GETs retried so far (each retry once).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Bytes `range` of the object `name` under the prefix, in one ranged GET, tried again
    /// (after the backoff, doubling) while it fails, times out, returns fewer or more bytes
    /// than asked, or returns bytes that `check` refuses.
    ///
    /// Errors: the object does not exist (at once); the last try failed (the message names
    /// the object's URL, the range, the number of tries and the last failure; `InvalidData`
    /// when that was `check`'s refusal).
    pub async fn get_range(
        &self,
        name: &str,
        range: Range<u64>,
        check: Option<&ByteCheck>,
    ) -> io::Result<bytes::Bytes> {
        let path = ObjPath::from(self.url.key(name));
        let want = range.end - range.start;
        let tries = self.opts.retries + 1;
        let mut last = String::new();
        let mut kind = io::ErrorKind::Other;
        let mut wait = self.opts.backoff;
        for attempt in 0..tries {
            if attempt > 0 {
                self.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
            }
            let got = tokio::time::timeout(
                self.opts.timeout,
                self.store.get_range(&path, range.clone()),
            )
            .await;
            kind = io::ErrorKind::Other;
            match got {
                Err(_) => {
                    kind = io::ErrorKind::TimedOut;
                    last = format!("timed out after {:?}", self.opts.timeout);
                }
                Ok(Err(e)) if not_found(&e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{}: no such object", self.url.object(name)),
                    ))
                }
                Ok(Err(e)) => last = e.to_string(),
                Ok(Ok(b)) if b.len() as u64 != want => {
                    kind = io::ErrorKind::UnexpectedEof;
                    last = format!("{} of {want} bytes arrived", b.len());
                }
                Ok(Ok(b)) if check.is_some_and(|c| !c(&b)) => {
                    kind = io::ErrorKind::InvalidData;
                    last = "the bytes do not match the record's checksum".into();
                }
                Ok(Ok(b)) => return Ok(b),
            }
        }
        Err(io::Error::new(
            kind,
            format!(
                "{}: GET of bytes {}..{} failed after {tries} tries: {last}",
                self.url.object(name),
                range.start,
                range.end
            ),
        ))
    }

    /// Uploads part `idx` (from 0) of the upload `id` of `name`; returns its ETag.
    ///
    /// Errors: the request fails, e.g. the upload no longer exists (the message names the
    /// object's URL and the part).
    pub async fn put_part(
        &self,
        name: &str,
        id: &str,
        idx: usize,
        bytes: Vec<u8>,
    ) -> io::Result<String> {
        let path = ObjPath::from(self.url.key(name));
        let id = id.to_string();
        self.store
            .put_part(&path, &id, idx, bytes.into())
            .await
            .map(|p| p.content_id)
            .map_err(|e| io::Error::other(format!("{}: part {idx}: {e}", self.url.object(name))))
    }
}

/// Whether an `object_store` error says the object does not exist.
fn not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

impl Remote {
    /// A client for the bucket of `url`, configured from the environment and profile files
    /// ([`S3Settings::from_env`]; region `us-east-1` when none is found; plain HTTP allowed
    /// when the endpoint is an `http://` URL).
    ///
    /// Errors: the runtime cannot start or `object_store` refuses the settings (the message
    /// names the URL).
    pub fn connect(url: &S3Url, opts: FetchOptions) -> io::Result<Self> {
        let s = S3Settings::from_env();
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&url.bucket)
            .with_region(s.region.as_deref().unwrap_or("us-east-1"))
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            });
        let mut client = ClientOptions::new()
            .with_timeout(opts.timeout)
            .with_connect_timeout(opts.timeout);
        if let Some(e) = &s.endpoint {
            b = b.with_endpoint(e);
            client = client.with_allow_http(e.starts_with("http://"));
        }
        b = b.with_client_options(client);
        if let Some(k) = &s.access_key_id {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &s.secret_access_key {
            b = b.with_secret_access_key(k);
        }
        if let Some(t) = &s.session_token {
            b = b.with_token(t);
        }
        let store = b
            .build()
            .map_err(|e| io::Error::other(format!("{url}: {e}")))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("deltafin-s3")
            .enable_all()
            .build()?;
        Ok(Self {
            client: Arc::new(RemoteClient {
                store: Arc::new(store),
                url: url.clone(),
                opts,
                retries: AtomicU64::new(0),
            }),
            rt,
        })
    }

    /// The runtime's handle (the fetcher spawns its workers on it).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.rt.handle().clone()
    }

    /// Runs `f` to completion on the client's runtime (from a thread outside it).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The whole object `name` under the prefix when it exists, refused past `max` bytes;
    /// `None` when there is no such object.
    ///
    /// Errors: the request fails (after the retries) or the object is larger than `max`
    /// (the message names its URL).
    pub fn get_small(&self, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        let Some(len) = self.size(name)? else {
            return Ok(None);
        };
        if len > max {
            return Err(io::Error::other(format!(
                "{}: {len} bytes, more than the {max} allowed",
                self.client.url.object(name)
            )));
        }
        if len == 0 {
            return Ok(Some(Vec::new()));
        }
        let b = self.block_on(self.client.get_range(name, 0..len, None))?;
        Ok(Some(b.to_vec()))
    }

    /// The size of the object `name` under the prefix, `None` when there is none.
    ///
    /// Errors: the request fails (the message names the object's URL).
    pub fn size(&self, name: &str) -> io::Result<Option<u64>> {
        let path = ObjPath::from(self.client.url.key(name));
        match self.block_on(async {
            tokio::time::timeout(self.client.opts.timeout, self.client.store.head(&path)).await
        }) {
            Ok(Ok(m)) => Ok(Some(m.size)),
            Ok(Err(e)) if not_found(&e) => Ok(None),
            Ok(Err(e)) => Err(io::Error::other(format!(
                "{}: {e}",
                self.client.url.object(name)
            ))),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: HEAD timed out", self.client.url.object(name)),
            )),
        }
    }

    /// Writes `bytes` as the object `name` under the prefix (one PUT).
    ///
    /// Errors: the request fails (the message names the object's URL).
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> io::Result<()> {
        let path = ObjPath::from(self.client.url.key(name));
        self.block_on(self.client.store.put(&path, bytes.into()))
            .map(|_| ())
            .map_err(|e| io::Error::other(format!("{}: PUT: {e}", self.client.url.object(name))))
    }

    /// Deletes the object `name` under the prefix (none there is no error).
    ///
    /// Errors: the request fails (the message names the object's URL).
    pub fn delete(&self, name: &str) -> io::Result<()> {
        let path = ObjPath::from(self.client.url.key(name));
        match self.block_on(self.client.store.delete(&path)) {
            Ok(()) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(io::Error::other(format!(
                "{}: DELETE: {e}",
                self.client.url.object(name)
            ))),
        }
    }

    /// Starts a multipart upload of the object `name`; returns its upload id.
    ///
    /// Errors: the request fails (the message names the object's URL).
    pub fn create_multipart(&self, name: &str) -> io::Result<String> {
        let path = ObjPath::from(self.client.url.key(name));
        self.block_on(self.client.store.create_multipart(&path))
            .map_err(|e| {
                io::Error::other(format!(
                    "{}: starting an upload: {e}",
                    self.client.url.object(name)
                ))
            })
    }

    /// Completes the upload `id` of `name` from its parts' ETags, in order.
    ///
    /// Errors: the request fails (the message names the object's URL).
    pub fn complete_multipart(&self, name: &str, id: &str, etags: &[String]) -> io::Result<()> {
        let path = ObjPath::from(self.client.url.key(name));
        let parts = etags
            .iter()
            .map(|e| PartId {
                content_id: e.clone(),
            })
            .collect();
        self.block_on(
            self.client
                .store
                .complete_multipart(&path, &id.to_string(), parts),
        )
        .map(|_| ())
        .map_err(|e| {
            io::Error::other(format!(
                "{}: completing the upload: {e}",
                self.client.url.object(name)
            ))
        })
    }
}
