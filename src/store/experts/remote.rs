//! The expert store over a pack on object storage (the local copy's mark,
//! [`RemoteSpec`]): a miss that the local tier holds is read from its mirror like a drive
//! read; any other miss is one ranged GET per record through the fetcher, attached to the
//! read engine, whose bytes are checked against the record's checksum and then kept in the
//! tier. A record read from the mirror that fails its check, or whose read fails, is dropped
//! from the tier and fetched again, never used.

use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::sync::Arc;

use super::{coalesced_spans, ExpertStore};
use crate::store::remote::{FetchJob, Fetcher, LocalTier, Remote, RemoteSpec, S3Url};

/// What the store keeps of a remote pack.
pub(super) struct RemoteState {
    /// The tier, when `--local-cache` keeps one and it could be opened.
    pub tier: Option<Arc<LocalTier>>,
    /// First record slot of each layer (`slot = base[layer] + expert`, manifest order).
    pub base: Vec<usize>,
    /// Experts whose next read must be a fetch (their mirror copy failed).
    pub refetch: HashSet<(usize, usize)>,
    /// The pack's URL.
    pub url: String,
}

impl ExpertStore {
    /// Reads the records from the pack on object storage that `spec` names, keeping them in
    /// a local tier in `dir` (the local copy's folder, whose `experts.bin` is the mirror)
    /// when the options give it a budget (`--local-cache-size`). Checksums must be set
    /// ([`ExpertStore::set_checksums`]). A tier that cannot be opened is left out with one
    /// warning.
    ///
    /// Errors: the URL is malformed, the client cannot be made, or the pread pool cannot
    /// start (the message names the URL).
    pub fn set_remote(&mut self, spec: &RemoteSpec, dir: &Path) -> io::Result<()> {
        let url = S3Url::parse(&spec.url).map_err(io::Error::other)?;
        let remote = Remote::connect(&url, self.remote_opts.clone())?;
        let mut base = Vec::with_capacity(self.units.len());
        let mut records = Vec::new();
        for row in &self.units {
            base.push(records.len());
            for u in row {
                let s = coalesced_spans(u);
                let start = s.first().map_or(0, |x| x.1);
                let end = s.last().map_or(0, |x| x.1 + x.2 as u64);
                records.push((start, end - start));
            }
        }
        let tier = match (self.local_cache, spec.identity()) {
            (Some(budget), Some(id)) => match LocalTier::open(dir, id, records, budget) {
                Ok(t) => Some(Arc::new(t)),
                Err(e) => {
                    eprintln!("warning: local cache {}: {e}; continuing without the local cache (records are fetched from object storage)", dir.display());
                    None
                }
            },
            _ => None,
        };
        let object = spec.object.clone();
        let t = tier.clone();
        self.engine
            .attach_fetcher(move |tx| Fetcher::start(remote, object, t, tx))?;
        self.remote = Some(RemoteState {
            tier,
            base,
            refetch: HashSet::new(),
            url: url.to_string(),
        });
        Ok(())
    }

    /// The pack's URL and its tier, when the store reads a pack on object storage.
    pub fn remote(&self) -> Option<(&str, Option<&LocalTier>)> {
        self.remote
            .as_ref()
            .map(|r| (r.url.as_str(), r.tier.as_deref()))
    }

    /// Whether expert `e` of `layer` must be fetched (not in the tier, or its copy failed):
    /// false for a pack on local drives.
    pub(super) fn must_fetch(&mut self, layer: usize, e: usize) -> bool {
        let Some(r) = &mut self.remote else {
            return false;
        };
        if r.refetch.remove(&(layer, e)) {
            return true;
        }
        let held = r.tier.as_ref().is_some_and(|t| t.lookup(r.base[layer] + e));
        if held {
            self.counters.tier_hits += 1;
        }
        !held
    }

    /// Queues the fetch of expert `e` of `layer` into `base` (its buffer), one job per span
    /// (one for a record of a remote pack); returns the number of jobs.
    pub(super) fn fetch(
        &mut self,
        layer: usize,
        e: usize,
        base: *mut u8,
        tag: usize,
        low: bool,
    ) -> usize {
        let unit = self.units[layer][e].clone();
        let spans = coalesced_spans(&unit);
        let whole = spans.len() == 1;
        let sum = self
            .checksums
            .as_ref()
            .and_then(|c| c.get(layer)?.get(e).copied())
            .filter(|_| whole);
        let slot = self.remote.as_ref().map(|r| r.base[layer] + e);
        for &(_, start, _, pos, end) in &spans {
            self.engine.submit_remote(FetchJob {
                tag,
                offset: start,
                len: (end - start) as usize,
                // SAFETY: pos + the span's length ≤ the unit's buffer_bytes ≤ the buffer's size.
                dst: unsafe { base.add(pos) },
                sum,
                record: slot.filter(|_| whole && sum.is_some()),
                low,
            });
        }
        spans.len()
    }

    /// After expert `e` of `layer`, read from the tier's mirror, failed its read or its check:
    /// drops it from the tier and has its next read fetch it. False for a pack on local drives
    /// or a read that did not come from the mirror.
    pub(super) fn drop_mirror_copy(&mut self, layer: usize, e: usize, from_mirror: bool) -> bool {
        let Some(r) = &mut self.remote else {
            return false;
        };
        if !from_mirror {
            return false;
        }
        if let Some(t) = &r.tier {
            t.forget(r.base[layer] + e);
        }
        r.refetch.insert((layer, e));
        true
    }
}
