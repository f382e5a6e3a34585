//! The bytes of a shared task store: named objects, with the two
//! conditional writes the manifest's protocol rests on (create-only, and an
//! update that names the version it replaces) and the conditional read a
//! poll makes (nothing comes back when the object is unchanged).
//!
//! Two kinds of store answer them:
//!
//! - object storage through the `object_store` crate: `s3://bucket/prefix`
//!   (an S3-compatible service with `AWS_ENDPOINT_URL`), `gs://bucket/prefix`,
//!   `az://container/prefix`, each with its credentials from the provider's
//!   usual environment; and `memory://` (one process's, for tests);
//! - a local folder, `file:///path`, that several servers of one machine
//!   share: an object is written to a temporary file and renamed over its
//!   name, a create-only write links the file in (which fails when the name
//!   is taken), and an update is made under an exclusive lock on the
//!   folder's `.lock`, after checking that the object is still the version
//!   the writer read. A writer killed at any point leaves every object whole
//!   (a temporary file at most, never read), and the lock is the kernel's,
//!   released with the process.

use std::fs::{self, File};
use std::io::{Read, Write as _};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, RetryConfig, UpdateVersion,
};

/// The version of an object as the store names it: an ETag (and a
/// generation, where the store has one), or the local file's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tag {
    e_tag: Option<String>,
    version: Option<String>,
}

/// What a read found.
#[derive(Debug)]
pub enum Got {
    /// The object is the version the read named.
    Unchanged,
    /// There is no such object.
    Missing,
    Found {
        bytes: Vec<u8>,
        tag: Tag,
    },
}

/// How a write treats what is there.
#[derive(Clone, Debug)]
pub enum Write {
    /// Only when there is no such object.
    Create,
    /// Only over this version of the object.
    Update(Tag),
    /// Whatever is there.
    Overwrite,
}

/// Why a store operation did not happen.
#[derive(Debug)]
pub enum Fault {
    /// A create-only write found the object there.
    Exists,
    /// An update named a version the store no longer holds.
    Stale,
    /// The store could not be reached, or refused the request; the words
    /// say which.
    Unavailable(String),
}

impl Fault {
    fn of(e: object_store::Error) -> Fault {
        match e {
            object_store::Error::AlreadyExists { .. } => Fault::Exists,
            object_store::Error::Precondition { .. } => Fault::Stale,
            object_store::Error::NotImplemented { operation, .. } => Fault::Unavailable(format!(
                "the store does not implement {operation}; decisio needs create-only and \
                 compare-and-swap writes"
            )),
            other => {
                // The store's own words, without the request's whole story.
                let mut text = other.to_string();
                if let Some(cut) = text.char_indices().nth(300).map(|(i, _)| i) {
                    text.truncate(cut);
                    text.push('…');
                }
                Fault::Unavailable(text)
            }
        }
    }

    fn io(what: &str, path: &Path, e: std::io::Error) -> Fault {
        Fault::Unavailable(format!("cannot {what} {}: {e}", path.display()))
    }
}

/// How long one request to a remote store may take, and how often a
/// failed one is tried again: short, so that a registration while the
/// store is down is answered 503 in seconds rather than held.
const REQUEST_TIMEOUT: &str = "10s";
const CONNECT_TIMEOUT: &str = "3s";
const RETRIES: usize = 1;

/// A store on object storage, and the runtime its client runs on (the
/// store's calls are made from threads outside any runtime).
struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    runtime: tokio::runtime::Runtime,
}

enum Kind {
    Remote(Remote),
    Folder(PathBuf),
}

/// A task store's objects.
pub struct Objects {
    kind: Kind,
}

/// The store's URL without credentials or query, for logs, `/health` and
/// errors.
pub fn sanitized(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let rest = match rest.split_once('@') {
        Some((_, host)) => host,
        None => rest,
    };
    format!("{scheme}://{rest}")
}

impl Objects {
    /// The store of `url`; fails with words naming the URL's form when it
    /// has none of the known schemes.
    pub fn open(url: &str) -> Result<Self, String> {
        let label = sanitized(url);
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            format!(
                "--task-store {label}: not a store URL; give s3://bucket/prefix, gs://bucket/prefix, \
                 az://container/prefix, file:///path or memory://"
            )
        })?;
        if scheme == "file" {
            let root = PathBuf::from(rest);
            if !root.is_absolute() {
                return Err(format!(
                    "--task-store {label}: a folder store needs an absolute path (file:///path)"
                ));
            }
            fs::create_dir_all(&root)
                .map_err(|e| format!("--task-store {label}: cannot create the folder: {e}"))?;
            return Ok(Objects {
                kind: Kind::Folder(root),
            });
        }
        let prefix = rest
            .split_once('/')
            .map_or("", |(_, p)| p)
            .trim_matches('/')
            .to_string();
        // TLS for the remote stores, with ring as its provider (a second
        // install is refused, harmlessly).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let retry = RetryConfig {
            max_retries: RETRIES,
            retry_timeout: Duration::from_secs(20),
            ..RetryConfig::default()
        };
        let failed = |e: object_store::Error| format!("--task-store {label}: {e}");
        // A cloud store from its provider's environment and the URL, with
        // the short timeouts and the one retry above.
        macro_rules! cloud {
            ($builder:ty, $key:ty) => {{
                let timeout: $key = "timeout".parse().map_err(failed)?;
                let connect: $key = "connect_timeout".parse().map_err(failed)?;
                Arc::new(
                    <$builder>::from_env()
                        .with_url(url)
                        .with_config(timeout, REQUEST_TIMEOUT)
                        .with_config(connect, CONNECT_TIMEOUT)
                        .with_retry(retry)
                        .build()
                        .map_err(failed)?,
                )
            }};
        }
        let store: Arc<dyn ObjectStore> = match scheme {
            "memory" => Arc::new(object_store::memory::InMemory::new()),
            "s3" | "s3a" => cloud!(
                object_store::aws::AmazonS3Builder,
                object_store::aws::AmazonS3ConfigKey
            ),
            "gs" => cloud!(
                object_store::gcp::GoogleCloudStorageBuilder,
                object_store::gcp::GoogleConfigKey
            ),
            "az" | "azure" | "abfs" | "abfss" => cloud!(
                object_store::azure::MicrosoftAzureBuilder,
                object_store::azure::AzureConfigKey
            ),
            other => {
                return Err(format!(
                    "--task-store {label}: the scheme `{other}` is not one decisio stores tasks \
                     on; give s3://, gs://, az://, file:// or memory://"
                ))
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("task-store")
            .enable_all()
            .build()
            .map_err(|e| format!("--task-store {label}: cannot start its client: {e}"))?;
        Ok(Objects {
            kind: Kind::Remote(Remote {
                store,
                prefix,
                runtime,
            }),
        })
    }

    /// The object `name`; [`Got::Unchanged`] when it is still the version
    /// `unless` names.
    pub fn get(&self, name: &str, unless: Option<&Tag>) -> Result<Got, Fault> {
        match &self.kind {
            Kind::Remote(r) => r.get(name, unless),
            Kind::Folder(root) => folder_get(root, name, unless),
        }
    }

    /// Writes `bytes` as `name` as `how` allows; the new version's tag.
    pub fn put(&self, name: &str, bytes: &[u8], how: Write) -> Result<Tag, Fault> {
        match &self.kind {
            Kind::Remote(r) => r.put(name, bytes, how),
            Kind::Folder(root) => folder_put(root, name, bytes, how),
        }
    }

    /// Removes `name`; nothing when it is not there.
    pub fn delete(&self, name: &str) -> Result<(), Fault> {
        match &self.kind {
            Kind::Remote(r) => r.delete(name),
            Kind::Folder(root) => {
                let path = root.join(name);
                match fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(Fault::io("remove", &path, e)),
                }
            }
        }
    }
}

impl Remote {
    fn path(&self, name: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(name)
        } else {
            ObjectPath::from(format!("{}/{name}", self.prefix))
        }
    }

    fn get(&self, name: &str, unless: Option<&Tag>) -> Result<Got, Fault> {
        let path = self.path(name);
        let options = GetOptions {
            if_none_match: unless.and_then(|t| t.e_tag.clone()),
            ..GetOptions::default()
        };
        self.runtime.block_on(async {
            match self.store.get_opts(&path, options).await {
                Ok(got) => {
                    let tag = Tag {
                        e_tag: got.meta.e_tag.clone(),
                        version: got.meta.version.clone(),
                    };
                    let bytes = got.bytes().await.map_err(Fault::of)?;
                    Ok(Got::Found {
                        bytes: bytes.to_vec(),
                        tag,
                    })
                }
                Err(object_store::Error::NotModified { .. }) => Ok(Got::Unchanged),
                Err(object_store::Error::NotFound { .. }) => Ok(Got::Missing),
                Err(e) => Err(Fault::of(e)),
            }
        })
    }

    fn put(&self, name: &str, bytes: &[u8], how: Write) -> Result<Tag, Fault> {
        let path = self.path(name);
        let mode = match how {
            Write::Create => PutMode::Create,
            Write::Update(tag) => PutMode::Update(UpdateVersion {
                e_tag: tag.e_tag,
                version: tag.version,
            }),
            Write::Overwrite => PutMode::Overwrite,
        };
        let payload = bytes.to_vec().into();
        self.runtime.block_on(async {
            let put = self
                .store
                .put_opts(&path, payload, PutOptions::from(mode))
                .await
                .map_err(Fault::of)?;
            Ok(Tag {
                e_tag: put.e_tag,
                version: put.version,
            })
        })
    }

    fn delete(&self, name: &str) -> Result<(), Fault> {
        let path = self.path(name);
        self.runtime
            .block_on(async {
                match self.store.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .map_err(Fault::of)
    }
}

fn folder_get(root: &Path, name: &str, unless: Option<&Tag>) -> Result<Got, Fault> {
    let path = root.join(name);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Got::Missing),
        Err(e) => return Err(Fault::io("read", &path, e)),
    };
    let tag = file_tag(&file.metadata().map_err(|e| Fault::io("read", &path, e))?);
    if unless == Some(&tag) {
        return Ok(Got::Unchanged);
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| Fault::io("read", &path, e))?;
    Ok(Got::Found { bytes, tag })
}

/// A local file's version: its inode, change time and length. Every write
/// renames a new file over the name, so a new version is a new inode.
fn file_tag(meta: &fs::Metadata) -> Tag {
    Tag {
        e_tag: Some(format!(
            "{:x}.{:x}.{:x}.{:x}",
            meta.ino(),
            meta.ctime(),
            meta.ctime_nsec(),
            meta.len()
        )),
        version: None,
    }
}

/// A new temporary file beside `path` holding `bytes`, synced.
fn temporary(path: &Path, bytes: &[u8]) -> Result<PathBuf, Fault> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| Fault::io("create", dir, e))?;
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut f = File::create(&tmp).map_err(|e| Fault::io("write", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Fault::io("write", &tmp, e))?;
    Ok(tmp)
}

fn sync_dir(path: &Path) -> Result<(), Fault> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Fault::io("sync", dir, e))
}

fn folder_put(root: &Path, name: &str, bytes: &[u8], how: Write) -> Result<Tag, Fault> {
    let path = root.join(name);
    let tmp = temporary(&path, bytes)?;
    let done = |r: Result<(), Fault>| {
        let _ = fs::remove_file(&tmp);
        r?;
        sync_dir(&path)?;
        let meta = fs::metadata(&path).map_err(|e| Fault::io("read", &path, e))?;
        Ok(file_tag(&meta))
    };
    match how {
        // A link fails when the name is taken: create-if-absent, atomically.
        Write::Create => done(match fs::hard_link(&tmp, &path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Fault::Exists),
            Err(e) => Err(Fault::io("write", &path, e)),
        }),
        Write::Overwrite => {
            fs::rename(&tmp, &path).map_err(|e| Fault::io("write", &path, e))?;
            done(Ok(()))
        }
        Write::Update(expected) => {
            let lock_path = root.join(".lock");
            let lock = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| Fault::io("open", &lock_path, e))?;
            lock.lock().map_err(|e| Fault::io("lock", &lock_path, e))?;
            let current = match fs::metadata(&path) {
                Ok(meta) => Some(file_tag(&meta)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return done(Err(Fault::io("read", &path, e))),
            };
            let r = if current.as_ref() != Some(&expected) {
                Err(Fault::Stale)
            } else {
                fs::rename(&tmp, &path).map_err(|e| Fault::io("write", &path, e))
            };
            // The new version's tag is read under the lock.
            let tagged = done(r);
            drop(lock);
            tagged
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(objects: &Objects) {
        let name = "probe/object.json";
        let _ = objects.delete(name);
        assert!(matches!(objects.get(name, None), Ok(Got::Missing)));
        let first = objects.put(name, b"1", Write::Create).unwrap();
        assert!(matches!(
            objects.put(name, b"2", Write::Create),
            Err(Fault::Exists)
        ));
        let second = objects
            .put(name, b"3", Write::Update(first.clone()))
            .unwrap();
        assert!(matches!(
            objects.put(name, b"4", Write::Update(first.clone())),
            Err(Fault::Stale)
        ));
        assert!(matches!(
            objects.get(name, Some(&second)),
            Ok(Got::Unchanged)
        ));
        match objects.get(name, Some(&first)).unwrap() {
            Got::Found { bytes, tag } => {
                assert_eq!(bytes, b"3");
                assert_eq!(tag, second);
            }
            other => panic!("{other:?}"),
        }
        objects.delete(name).unwrap();
        assert!(matches!(
            objects.put(name, b"5", Write::Update(second)),
            Err(Fault::Stale)
        ));
    }

    #[test]
    fn both_kinds_answer_the_conditional_writes_and_reads() {
        check(&Objects::open("memory://").unwrap());
        let dir = std::env::temp_dir().join(format!("decisio-objects-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        check(&Objects::open(&format!("file://{}", dir.display())).unwrap());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_label_never_shows_credentials() {
        assert_eq!(
            sanitized("s3://key:secret@bucket/prefix?region=x"),
            "s3://bucket/prefix"
        );
        assert_eq!(sanitized("file:///srv/tasks"), "file:///srv/tasks");
    }
}
