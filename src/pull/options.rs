//! How a pull runs: [`PullOptions`] and the fetch method [`Via`].

/// How wheels are fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Via {
    /// HTTPS from the JSON API, falling back to `pip download` on failure.
    #[default]
    Auto,
    /// HTTPS only.
    Http,
    /// `pip download` only.
    Pip,
}

/// Options of [`pull`](crate::pull::pull).
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// No progress bars or messages on stderr.
    pub quiet: bool,
    /// Fetch method.
    pub via: Via,
    /// Base of the JSON API, without trailing slash (default `https://pypi.org/pypi`).
    pub index_url: String,
    /// Fetch and verify again even when the model file is already there (repairs a damaged
    /// cached copy; the old file is replaced only once the new one is verified).
    pub force: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            quiet: false,
            via: Via::Auto,
            index_url: "https://pypi.org/pypi".into(),
            force: false,
        }
    }
}
