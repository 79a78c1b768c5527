//! Endpoint, region and credentials of object storage, found the way the AWS tools find them:
//! the `AWS_*` environment variables first (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION` or `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3` or
//! `AWS_ENDPOINT_URL`), then the profile (`AWS_PROFILE`, else `default`) of the shared
//! credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`) and of the
//! config file (`AWS_CONFIG_FILE`, else `~/.aws/config`, where a profile's section is
//! `[profile NAME]`). This is the one place Deltafin reads environment variables for its
//! configuration: they are the standard of object storage. Whatever else `object_store` reads
//! from `AWS_*` (web identity, container credentials) applies too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What was found, each field from the first place that sets it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct S3Settings {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
}

/// The `key = value` pairs of section `section` of the INI text `text` (keys lower-cased;
/// lines indented under a key, AWS's nested settings, are skipped).
fn ini_section(text: &str, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        if let Some(name) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if !inside || line.starts_with([' ', '\t']) {
            continue;
        }
        if let Some((k, v)) = t.split_once('=') {
            let v = v.trim();
            if !v.is_empty() {
                out.insert(k.trim().to_ascii_lowercase(), v.to_string());
            }
        }
    }
    out
}

impl S3Settings {
    /// The settings from the environment and profile files, reading variables through `var`
    /// and files through `read` (the process's own in [`S3Settings::from_env`]).
    pub fn resolve(
        var: &dyn Fn(&str) -> Option<String>,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> Self {
        let var = |k: &str| var(k).filter(|v| !v.is_empty());
        let home = var("HOME").map(PathBuf::from);
        let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let file = |over: &str, name: &str| {
            var(over)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
                .and_then(|p| read(&p))
                .unwrap_or_default()
        };
        let creds = ini_section(
            &file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            &profile,
        );
        let config_section = match profile.as_str() {
            "default" => "default".to_string(),
            p => format!("profile {p}"),
        };
        let config = ini_section(&file("AWS_CONFIG_FILE", "config"), &config_section);
        let prof = |k: &str| creds.get(k).or_else(|| config.get(k)).cloned();
        Self {
            access_key_id: var("AWS_ACCESS_KEY_ID").or_else(|| prof("aws_access_key_id")),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY")
                .or_else(|| prof("aws_secret_access_key")),
            session_token: var("AWS_SESSION_TOKEN").or_else(|| prof("aws_session_token")),
            region: var("AWS_REGION")
                .or_else(|| var("AWS_DEFAULT_REGION"))
                .or_else(|| prof("region")),
            endpoint: var("AWS_ENDPOINT_URL_S3")
                .or_else(|| var("AWS_ENDPOINT_URL"))
                .or_else(|| prof("endpoint_url")),
        }
    }

    /// [`S3Settings::resolve`] over this process's environment and files.
    pub fn from_env() -> Self {
        Self::resolve(&|k| std::env::var(k).ok(), &|p| {
            std::fs::read_to_string(p).ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_beat_the_profile_which_fills_the_rest() {
        let files: HashMap<PathBuf, String> = [
            (
                PathBuf::from("/h/.aws/credentials"),
                "[default]\naws_access_key_id = DEF\n[team]\naws_access_key_id = TEAM\naws_secret_access_key=S3CR3T\n".to_string(),
            ),
            (
                PathBuf::from("/h/.aws/config"),
                "[profile team]\nregion = eu-west-3\ns3 =\n  endpoint_url = http://nested\nendpoint_url = http://127.0.0.1:9000\n".to_string(),
            ),
        ]
        .into();
        let read = |p: &Path| files.get(p).cloned();
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let s = S3Settings::resolve(&env(&[("HOME", "/h"), ("AWS_PROFILE", "team")]), &read);
        assert_eq!(
            s,
            S3Settings {
                access_key_id: Some("TEAM".into()),
                secret_access_key: Some("S3CR3T".into()),
                session_token: None,
                region: Some("eu-west-3".into()),
                endpoint: Some("http://127.0.0.1:9000".into()),
            }
        );
        let s = S3Settings::resolve(
            &env(&[
                ("HOME", "/h"),
                ("AWS_PROFILE", "team"),
                ("AWS_ACCESS_KEY_ID", "ENV"),
                ("AWS_DEFAULT_REGION", "us-west-2"),
                ("AWS_ENDPOINT_URL", "http://e"),
                ("AWS_ENDPOINT_URL_S3", "http://s3e"),
            ]),
            &read,
        );
        assert_eq!(s.access_key_id.as_deref(), Some("ENV"));
        assert_eq!(s.secret_access_key.as_deref(), Some("S3CR3T"));
        assert_eq!(s.region.as_deref(), Some("us-west-2"));
        assert_eq!(s.endpoint.as_deref(), Some("http://s3e"));
        let d = S3Settings::resolve(&env(&[("HOME", "/h")]), &read);
        assert_eq!(d.access_key_id.as_deref(), Some("DEF"));
        assert_eq!(d.region, None);
    }
}
