//! The heat file: how often each (layer, expert) was used, summed over runs, so that the next
//! run's cache starts out knowing which experts are hot.
//!
//! Format (JSON, written atomically through a temporary file and a rename):
//! `{"format": "deltafin-heat-1", "layers": L, "experts": E, "counts": [[u64; E]; L]}`, where
//! `counts[l][e]` is the number of forward passes (batches) that used expert `e` of layer `l`.
//! A file whose shape does not match the model is ignored (and replaced on save).

use std::collections::HashMap;
use std::path::Path;

use super::expert_cache::Key;

/// The largest starting use count a seed gives (the hottest expert of its layer).
pub const SEED_MAX: u64 = 8;

/// Use counts per (layer, expert).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heat {
    pub counts: Vec<Vec<u64>>,
}

impl Heat {
    /// All zeros for `layers × experts`.
    pub fn zeros(layers: usize, experts: usize) -> Self {
        Self {
            counts: vec![vec![0; experts]; layers],
        }
    }

    /// Reads `path`; a missing, malformed or differently shaped file gives zeros.
    pub fn load(path: &Path, layers: usize, experts: usize) -> Self {
        let parsed = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| {
                if v["format"] != "deltafin-heat-1" {
                    return None;
                }
                let counts: Vec<Vec<u64>> = serde_json::from_value(v["counts"].clone()).ok()?;
                let ok = counts.len() == layers && counts.iter().all(|r| r.len() == experts);
                ok.then_some(Self { counts })
            });
        parsed.unwrap_or_else(|| Self::zeros(layers, experts))
    }

    /// Adds `other` (same shape) to these counts.
    pub fn add(&mut self, other: &Heat) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            for (x, y) in a.iter_mut().zip(b) {
                *x = x.saturating_add(*y);
            }
        }
    }

    /// Starting use counts for the cache: per layer, `count × SEED_MAX / max count` (so the
    /// hottest expert of each layer starts at [`SEED_MAX`]); zeros are left out.
    pub fn seed(&self) -> HashMap<Key, u64> {
        let mut m = HashMap::new();
        for (l, row) in self.counts.iter().enumerate() {
            let max = row.iter().copied().max().unwrap_or(0);
            if max == 0 {
                continue;
            }
            for (e, &c) in row.iter().enumerate() {
                let s = (c as u128 * SEED_MAX as u128 / max as u128) as u64;
                if s > 0 {
                    m.insert((l as u32, e as u32), s);
                }
            }
        }
        m
    }

    /// Adds `run` to the counts stored at `path` and writes the sum back atomically.
    ///
    /// Errors: the file cannot be written (the message names it).
    pub fn merge_into_file(run: &Heat, path: &Path) -> std::io::Result<()> {
        let layers = run.counts.len();
        let experts = run.counts.first().map_or(0, |r| r.len());
        let mut total = Self::load(path, layers, experts);
        total.add(run);
        let v = serde_json::json!({
            "format": "deltafin-heat-1",
            "layers": layers,
            "experts": experts,
            "counts": total.counts,
        });
        let tmp = path.with_extension("json.tmp");
        let wrap =
            |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(wrap)?;
        }
        std::fs::write(&tmp, v.to_string()).map_err(wrap)?;
        std::fs::rename(&tmp, path).map_err(wrap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_add_up_and_seed_scales_per_layer() {
        let dir = tempfile::tempdir().unwrap();
        // the folder is created on the first save
        let p = dir.path().join("sub").join("heat.json");
        let mut run = Heat::zeros(2, 3);
        run.counts[0] = vec![4, 1, 0];
        run.counts[1] = vec![0, 0, 2];
        Heat::merge_into_file(&run, &p).unwrap();
        Heat::merge_into_file(&run, &p).unwrap();
        let h = Heat::load(&p, 2, 3);
        assert_eq!(h.counts, vec![vec![8, 2, 0], vec![0, 0, 4]]);
        let s = h.seed();
        assert_eq!(s.get(&(0, 0)), Some(&8));
        assert_eq!(s.get(&(0, 1)), Some(&2));
        assert_eq!(s.get(&(0, 2)), None);
        assert_eq!(s.get(&(1, 2)), Some(&8));
        // another model's shape is ignored
        assert_eq!(Heat::load(&p, 3, 3), Heat::zeros(3, 3));
    }
}
