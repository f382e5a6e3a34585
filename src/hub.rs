//! Models and tokenizers from the Hugging Face Hub, through the cache folder
//! shared with `huggingface_hub` and mlx-lm.
//!
//! `--model` and `--tokenizer` take either a local folder or a repository
//! id. A repository id is `org/name`, optionally followed by `@revision`: a
//! branch, a tag or a 40-character commit (`org/name@main`,
//! `org/name@v1.0`, `org/name@0123…cdef`). Without `@revision` the caller's
//! default revision is used (a base may pin one), else `main`. An existing
//! folder always wins over a repository id of the same spelling.
//!
//! The cache folder is `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`, in the hub's layout:
//! `models--org--name/refs/<branch>` holds a commit,
//! `snapshots/<commit>/<file>` are relative links into `blobs/`.
//!
//! The rule: when the snapshot of the revision (a commit, or the commit a
//! cached `refs/<branch>` names) holds every required file, it is used as
//! is and the network is never touched. A cached branch is therefore not
//! refreshed; `hf download org/name` (or a commit in the spec) moves it.
//! Otherwise, unless `HF_HUB_OFFLINE` is set, the revision's file list is
//! read from the hub (`HF_ENDPOINT`, else `https://huggingface.co`; token
//! from `HF_TOKEN`, else the token file `HF_TOKEN_PATH` or `HF_HOME/token`)
//! and the missing files are downloaded with the `hf-hub` crate, one
//! progress bar per file (`HF_HUB_DISABLE_PROGRESS_BARS=1` hides them).
//!
//! Required files of a model: `config.json`, the weights
//! (`model.safetensors`, or `model.safetensors.index.json` and every shard
//! it lists), `tokenizer.json` and `tokenizer_config.json`; downloaded too
//! when the repository has them: `generation_config.json`,
//! `special_tokens_map.json`, `chat_template.jinja`, `chat_template.json`.
//! A tokenizer repository needs the tokenizer files only; [`Wanted::Config`]
//! asks for `config.json` alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};

/// The hub's address when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

const WEIGHTS: &str = "model.safetensors";
const WEIGHTS_INDEX: &str = "model.safetensors.index.json";
const TOKENIZER_FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];
const OPTIONAL_TOKENIZER_FILES: [&str; 3] = [
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Which files a repository must provide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// A model: config, weights and tokenizer files.
    Model,
    /// A tokenizer: the tokenizer files only.
    Tokenizer,
    /// `config.json` only (to read a checkpoint's configuration without
    /// its weights).
    Config,
}

/// Where and how to reach the hub; [`HubSettings::from_env`] reads the
/// variables `huggingface_hub` reads.
#[derive(Clone, Debug)]
pub struct HubSettings {
    /// The cache folder (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`).
    pub cache: PathBuf,
    /// The hub's base URL (`HF_ENDPOINT`).
    pub endpoint: String,
    /// Never use the network (`HF_HUB_OFFLINE`).
    pub offline: bool,
    /// An access token (`HF_TOKEN`, else the token file).
    pub token: Option<String>,
    /// A progress bar per downloaded file.
    pub progress: bool,
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_true(name: &str) -> bool {
    env_nonempty(name).is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "on" | "yes" | "true"
        )
    })
}

impl HubSettings {
    /// The settings the environment gives, by `huggingface_hub`'s rules:
    /// `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`, else
    /// `~/.cache/huggingface`; the cache is `HF_HUB_CACHE`, else the legacy
    /// `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`; `HF_HUB_OFFLINE`
    /// (else `TRANSFORMERS_OFFLINE`) is true for 1, on, yes or true.
    pub fn from_env() -> HubSettings {
        let user_home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let path = |v: String| match v.strip_prefix("~/") {
            Some(rest) => user_home.join(rest),
            None => PathBuf::from(v),
        };
        let home = env_nonempty("HF_HOME").map(path).unwrap_or_else(|| {
            env_nonempty("XDG_CACHE_HOME")
                .map(path)
                .unwrap_or_else(|| user_home.join(".cache"))
                .join("huggingface")
        });
        let cache = env_nonempty("HF_HUB_CACHE")
            .or_else(|| env_nonempty("HUGGINGFACE_HUB_CACHE"))
            .map(path)
            .unwrap_or_else(|| home.join("hub"));
        let token_file = env_nonempty("HF_TOKEN_PATH")
            .map(path)
            .unwrap_or_else(|| home.join("token"));
        let token = env_nonempty("HF_TOKEN")
            .map(|t| t.trim().to_string())
            .or_else(|| {
                std::fs::read_to_string(token_file)
                    .ok()
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty())
            });
        let offline = if env_nonempty("HF_HUB_OFFLINE").is_some() {
            env_true("HF_HUB_OFFLINE")
        } else {
            env_true("TRANSFORMERS_OFFLINE")
        };
        HubSettings {
            cache,
            endpoint: env_nonempty("HF_ENDPOINT")
                .map(|e| e.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            offline,
            token,
            progress: !env_true("HF_HUB_DISABLE_PROGRESS_BARS"),
        }
    }
}

/// Why a model or tokenizer could not be found; each message says what to
/// do next.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Neither an existing folder nor `org/name[@revision]`.
    #[error(
        "`{spec}` is neither a folder nor a repository id; pass a local folder, \
         or a Hugging Face repository as `org/name` or `org/name@revision`"
    )]
    NotFound {
        /// What was given.
        spec: String,
    },
    /// `HF_HUB_OFFLINE` is set and files are not in the cache.
    #[error(
        "{repo}@{revision}: {} not in the Hugging Face cache ({}) and HF_HUB_OFFLINE is set; \
         download {} with `hf download {repo} --revision {revision}`, or unset HF_HUB_OFFLINE \
         so that missing files are downloaded at start-up",
        list(missing), cache.display(), them(missing)
    )]
    Offline {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// Files absent from the cache.
        missing: Vec<String>,
        /// The cache folder searched.
        cache: PathBuf,
    },
    /// The hub could not be reached and files are not in the cache.
    #[error(transparent)]
    Unreachable(Box<Unreachable>),
    /// The hub answered 401, 403 or 404.
    #[error(
        "{repo}@{revision}: the hub at {endpoint} answered {status}: the repository or the \
         revision does not exist, or it is private or gated; check the spelling, accept the \
         model's terms on its page if it is gated, and set HF_TOKEN (or run `hf auth login`) \
         to a token that may read it"
    )]
    NoAccess {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The hub's address.
        endpoint: String,
        /// The HTTP status.
        status: u16,
    },
    /// The repository lacks a file that is required.
    #[error("{repo}@{revision} has no {file}; {hint}")]
    Incomplete {
        /// The repository id.
        repo: String,
        /// The revision.
        revision: String,
        /// The file the repository lacks.
        file: String,
        /// What to do instead.
        hint: &'static str,
    },
    /// Any other failure while downloading or reading the cache.
    #[error("{repo}@{revision}: {what}: {reason}")]
    Other {
        /// The repository id.
        repo: String,
        /// The revision.
        revision: String,
        /// What was being done.
        what: String,
        /// The underlying error.
        reason: String,
    },
}

/// The hub could not be reached and files are not in the cache.
#[derive(Debug, thiserror::Error)]
#[error(
    "{repo}@{revision}: {} not in the Hugging Face cache ({}) and the hub at {endpoint} \
     could not be reached ({reason}); check the network or HF_ENDPOINT, or fetch \
     {} into that cache with `hf download {repo} --revision {revision}`",
    list(missing), cache.display(), them(missing)
)]
pub struct Unreachable {
    /// The repository id.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// Files absent from the cache.
    pub missing: Vec<String>,
    /// The cache folder searched.
    pub cache: PathBuf,
    /// The hub's address tried.
    pub endpoint: String,
    /// The transport's error.
    pub reason: String,
}

fn list(files: &[String]) -> String {
    match files {
        [one] => format!("{one} is"),
        _ => format!("{} are", files.join(", ")),
    }
}

fn them(files: &[String]) -> &'static str {
    if files.len() == 1 {
        "it"
    } else {
        "them"
    }
}

/// A repository id with an optional revision, as `--model` takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoSpec {
    /// `org/name`.
    pub repo: String,
    /// The text after `@`, if any.
    pub revision: Option<String>,
}

impl RepoSpec {
    /// Parses `org/name` or `org/name@revision`; `None` when `spec` is not
    /// one.
    pub fn parse(spec: &str) -> Option<RepoSpec> {
        let (repo, revision) = match spec.split_once('@') {
            Some((r, rev)) if !rev.is_empty() => (r, Some(rev.to_string())),
            Some(_) => return None,
            None => (spec, None),
        };
        let (org, name) = repo.split_once('/')?;
        let part_ok = |p: &str| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && !p.ends_with('.')
                && !p.contains("..")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        (part_ok(org) && part_ok(name)).then(|| RepoSpec {
            repo: repo.to_string(),
            revision,
        })
    }
}

fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Resolves `spec` (a folder, or `org/name[@revision]`) to a folder holding
/// the files `files` needs, with the environment's [`HubSettings`].
/// `revision` is used when the spec names none.
pub fn resolve(spec: &str, revision: Option<&str>, files: Wanted) -> Result<PathBuf, HubError> {
    resolve_with(spec, revision, files, &HubSettings::from_env())
}

/// [`resolve`] with explicit settings.
pub fn resolve_with(
    spec: &str,
    revision: Option<&str>,
    files: Wanted,
    settings: &HubSettings,
) -> Result<PathBuf, HubError> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let Some(parsed) = RepoSpec::parse(spec) else {
        return Err(HubError::NotFound {
            spec: spec.to_string(),
        });
    };
    let revision = parsed
        .revision
        .as_deref()
        .or(revision)
        .unwrap_or("main")
        .to_string();
    let repo = CachedRepo::new(settings, &parsed.repo, &revision);
    let missing = match repo.snapshot() {
        Some(snapshot) => {
            let missing = missing_files(&snapshot, files);
            if missing.is_empty() {
                return Ok(snapshot);
            }
            missing
        }
        None => required_names(files),
    };
    if settings.offline {
        return Err(HubError::Offline {
            repo: parsed.repo,
            revision,
            missing,
            cache: settings.cache.clone(),
        });
    }
    download(settings, &repo, files, missing)
}

/// A repository's place in the cache folder.
struct CachedRepo {
    id: String,
    revision: String,
    folder: PathBuf,
}

impl CachedRepo {
    fn new(settings: &HubSettings, id: &str, revision: &str) -> CachedRepo {
        let repo = Repo::with_revision(id.to_string(), RepoType::Model, revision.to_string());
        CachedRepo {
            id: id.to_string(),
            revision: revision.to_string(),
            folder: settings.cache.join(repo.folder_name()),
        }
    }

    /// The commit the revision names in the cache, if known.
    fn commit(&self) -> Option<String> {
        if is_commit(&self.revision) {
            return Some(self.revision.to_ascii_lowercase());
        }
        let text = std::fs::read_to_string(self.folder.join("refs").join(&self.revision)).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_string())
    }

    fn snapshot_of(&self, commit: &str) -> PathBuf {
        self.folder.join("snapshots").join(commit)
    }

    /// The cached snapshot folder of the revision, if there is one.
    fn snapshot(&self) -> Option<PathBuf> {
        let dir = self.snapshot_of(&self.commit()?);
        dir.is_dir().then_some(dir)
    }

    fn other(&self, what: impl Into<String>, reason: impl ToString) -> HubError {
        HubError::Other {
            repo: self.id.clone(),
            revision: self.revision.clone(),
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

fn required_names(files: Wanted) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    if files == Wanted::Model {
        names.push("config.json".into());
        names.push(format!("{WEIGHTS} (or {WEIGHTS_INDEX} and its shards)"));
    }
    match files {
        Wanted::Config => names.push("config.json".into()),
        _ => names.extend(TOKENIZER_FILES.iter().map(|f| f.to_string())),
    }
    names
}

/// The shard files a safetensors index lists, in order, without repeats.
fn shards_of(index: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(index).map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("it has no `weight_map` object")?;
    let mut seen = BTreeSet::new();
    let mut shards = Vec::new();
    for file in map.values() {
        let file = file
            .as_str()
            .ok_or("a `weight_map` value is not a string")?;
        if file.contains("..") || file.starts_with('/') {
            return Err(format!("the shard name `{file}` leaves the repository"));
        }
        if seen.insert(file.to_string()) {
            shards.push(file.to_string());
        }
    }
    Ok(shards)
}

/// Required files absent from a snapshot folder (a link whose blob is gone
/// counts as absent).
fn missing_files(snapshot: &Path, files: Wanted) -> Vec<String> {
    let has = |f: &str| snapshot.join(f).is_file();
    let mut missing = Vec::new();
    if files == Wanted::Model {
        if !has("config.json") {
            missing.push("config.json".to_string());
        }
        if has(WEIGHTS_INDEX) {
            match shards_of(&snapshot.join(WEIGHTS_INDEX)) {
                Ok(shards) => missing.extend(shards.into_iter().filter(|s| !has(s))),
                Err(e) => missing.push(format!("{WEIGHTS_INDEX} (unreadable: {e})")),
            }
        } else if !has(WEIGHTS) {
            missing.push(format!("{WEIGHTS} (or {WEIGHTS_INDEX} and its shards)"));
        }
    }
    if files == Wanted::Config {
        if !has("config.json") {
            missing.push("config.json".to_string());
        }
        return missing;
    }
    missing.extend(
        TOKENIZER_FILES
            .iter()
            .filter(|f| !has(f))
            .map(|f| f.to_string()),
    );
    missing
}

/// Reads the revision's file list from the hub and downloads what the
/// snapshot lacks; returns the snapshot folder.
fn download(
    settings: &HubSettings,
    cached: &CachedRepo,
    files: Wanted,
    missing: Vec<String>,
) -> Result<PathBuf, HubError> {
    let api = ApiBuilder::from_cache(Cache::new(settings.cache.clone()))
        .with_endpoint(settings.endpoint.clone())
        .with_token(settings.token.clone())
        .with_progress(settings.progress)
        .build()
        .map_err(|e| cached.other("starting the hub client", e))?;
    let fail = |e: ApiError, what: &str| hub_error(e, what, settings, cached, &missing);
    let info = api
        .repo(Repo::with_revision(
            cached.id.clone(),
            RepoType::Model,
            cached.revision.clone(),
        ))
        .info()
        .map_err(|e| fail(e, "reading the repository's file list"))?;
    let commit = info.sha.to_ascii_lowercase();
    if !is_commit(&commit) {
        return Err(cached.other(
            "reading the repository's file list",
            format!("the hub named `{}` as the commit", info.sha),
        ));
    }
    let listed: BTreeSet<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    let snapshot = cached.snapshot_of(&commit);
    let had_commit_ref = cached.folder.join("refs").join(&commit).exists();
    // Downloads name the commit, so that every file lands in one snapshot
    // even if the branch moves meanwhile.
    let pinned = api.repo(Repo::with_revision(
        cached.id.clone(),
        RepoType::Model,
        commit.clone(),
    ));
    let fetch = |file: &str| -> Result<(), HubError> {
        if snapshot.join(file).is_file() {
            return Ok(());
        }
        tracing::info!(
            "downloading {file} of {}@{} into {}",
            cached.id,
            cached.revision,
            settings.cache.display()
        );
        pinned
            .download(file)
            .map(|_| ())
            .map_err(|e| fail(e, &format!("downloading {file}")))
    };
    let wanted = wanted_files(cached, files, &listed, || {
        fetch(WEIGHTS_INDEX)?;
        shards_of(&snapshot.join(WEIGHTS_INDEX))
            .map_err(|e| cached.other(format!("reading {WEIGHTS_INDEX}"), e))
    })?;
    for file in wanted.iter().filter(|f| listed.contains(f.as_str())) {
        fetch(file)?;
    }
    // hf-hub records the pinned commit as a ref of its own name; the hub's
    // layout keeps refs for branches and tags only.
    if !had_commit_ref && !is_commit(&cached.revision) {
        let _ = std::fs::remove_file(cached.folder.join("refs").join(&commit));
    }
    if !is_commit(&cached.revision) {
        let ref_path = cached.folder.join("refs").join(&cached.revision);
        std::fs::create_dir_all(ref_path.parent().unwrap_or(&cached.folder))
            .and_then(|_| std::fs::write(&ref_path, &commit))
            .map_err(|e| cached.other(format!("writing {}", ref_path.display()), e))?;
    }
    let still = missing_files(&snapshot, files);
    if !still.is_empty() {
        return Err(cached.other(
            "after downloading",
            format!("{} still missing from {}", list(&still), snapshot.display()),
        ));
    }
    Ok(snapshot)
}

/// A hub client's error as decisio words it: no access (401, 403, 404),
/// another status, or an unreachable hub (with what the snapshot lacks).
fn hub_error(
    e: ApiError,
    what: &str,
    settings: &HubSettings,
    cached: &CachedRepo,
    missing: &[String],
) -> HubError {
    match e {
        ApiError::RequestError(err) => match *err {
            ureq::Error::StatusCode(status @ (401 | 403 | 404)) => HubError::NoAccess {
                repo: cached.id.clone(),
                revision: cached.revision.clone(),
                endpoint: settings.endpoint.clone(),
                status,
            },
            ureq::Error::StatusCode(status) => {
                cached.other(what, format!("the hub answered {status}"))
            }
            other => HubError::Unreachable(Box::new(Unreachable {
                repo: cached.id.clone(),
                revision: cached.revision.clone(),
                missing: missing.to_vec(),
                cache: settings.cache.clone(),
                endpoint: settings.endpoint.clone(),
                reason: other.to_string(),
            })),
        },
        other => cached.other(what, other),
    }
}

/// The files to download for `files` from those the revision lists; the
/// weights' shards are read from their index (`shards`, which downloads
/// it). A file the product needs and the revision lacks is an error that
/// says what to pass instead.
fn wanted_files(
    cached: &CachedRepo,
    files: Wanted,
    listed: &BTreeSet<&str>,
    shards: impl FnOnce() -> Result<Vec<String>, HubError>,
) -> Result<Vec<String>, HubError> {
    let incomplete = |file: &str, hint: &'static str| HubError::Incomplete {
        repo: cached.id.clone(),
        revision: cached.revision.clone(),
        file: file.to_string(),
        hint,
    };
    let mut wanted: Vec<String> = Vec::new();
    if files == Wanted::Model {
        if !listed.contains("config.json") {
            return Err(incomplete(
                "config.json",
                "pass a model repository (an MLX conversion) or a local folder",
            ));
        }
        wanted.push("config.json".into());
        if listed.contains(WEIGHTS_INDEX) {
            wanted.extend(shards()?);
        } else if listed.contains(WEIGHTS) {
            wanted.push(WEIGHTS.into());
        } else {
            return Err(incomplete(
                WEIGHTS,
                "the model needs safetensors weights (an MLX conversion); pick a repository \
                 that has them",
            ));
        }
        wanted.push("generation_config.json".into());
    }
    if files == Wanted::Config {
        if !listed.contains("config.json") {
            return Err(incomplete(
                "config.json",
                "pass a model repository or a local folder",
            ));
        }
        wanted.push("config.json".into());
    }
    for file in TOKENIZER_FILES.iter().filter(|_| files != Wanted::Config) {
        if !listed.contains(file) {
            return Err(incomplete(
                file,
                "pass a repository with the tokenizer files, or --tokenizer with one",
            ));
        }
        wanted.push(file.to_string());
    }
    if files != Wanted::Config {
        wanted.extend(OPTIONAL_TOKENIZER_FILES.iter().map(|f| f.to_string()));
    }
    Ok(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let p = |s| RepoSpec::parse(s);
        assert_eq!(
            p("org/name"),
            Some(RepoSpec {
                repo: "org/name".into(),
                revision: None
            })
        );
        assert_eq!(
            p("mlx-community/Qwen3.6-35B-A3B-6bit@v1.0")
                .unwrap()
                .revision,
            Some("v1.0".into())
        );
        for bad in [
            "name",
            "org/name/extra",
            "/abs/path",
            "./rel",
            "../up/x",
            "org/",
            "/name",
            "org/name@",
            "org/na me",
        ] {
            assert_eq!(p(bad), None, "{bad}");
        }
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        assert!(!is_commit("main"));
    }
}
