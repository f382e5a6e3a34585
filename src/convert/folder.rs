//! Writing the output folder all at once.
//!
//! Files go into a hidden staging folder next to the target; only when all
//! of them are written is it renamed into place, so a reader never sees a
//! half-written conversion. A failed or interrupted conversion leaves at
//! most the staging folder behind, never a damaged target.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::ConvertError;

/// A staging folder that becomes `target` on [`Staging::commit`] and is
/// removed if dropped before that.
pub(crate) struct Staging {
    dir: PathBuf,
    target: PathBuf,
    committed: bool,
}

fn output_error(path: &Path) -> impl FnOnce(std::io::Error) -> ConvertError + '_ {
    move |error| ConvertError::Output {
        path: path.to_owned(),
        error,
    }
}

/// Whether `path` exists and holds something: a non-empty folder, or any
/// other kind of file.
fn is_occupied(path: &Path) -> Result<bool, ConvertError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(output_error(path)(e)),
        Ok(meta) if meta.is_dir() => Ok(fs::read_dir(path)
            .map_err(output_error(path))?
            .next()
            .is_some()),
        Ok(_) => Ok(true),
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    }
}

/// A sibling of `target` named `.{name}.{tag}-{pid}-{nanos}`.
fn sibling(target: &Path, tag: &str) -> Result<PathBuf, ConvertError> {
    let name = target
        .file_name()
        .ok_or_else(|| ConvertError::Output {
            path: target.to_owned(),
            error: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the output path must end in a folder name",
            ),
        })?
        .to_string_lossy()
        .into_owned();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let file = format!(".{name}.{tag}-{}-{nanos}", std::process::id());
    Ok(match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.join(file),
        _ => PathBuf::from(file),
    })
}

impl Staging {
    /// Refuses an occupied `target` unless `force`, then creates the
    /// staging folder (and `target`'s parent folders).
    pub fn new(target: &Path, force: bool) -> Result<Self, ConvertError> {
        if !force && is_occupied(target)? {
            return Err(ConvertError::OutputExists {
                path: target.to_owned(),
            });
        }
        let dir = sibling(target, "partial")?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(output_error(parent))?;
        }
        fs::create_dir(&dir).map_err(output_error(&dir))?;
        Ok(Self {
            dir,
            target: target.to_owned(),
            committed: false,
        })
    }

    /// Where to write the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves the staging folder to the target. An existing target (only
    /// there if it was empty or `force` was given) is moved aside first and
    /// deleted once the new folder is in place.
    pub fn commit(mut self) -> Result<(), ConvertError> {
        let target = self.target.clone();
        let aside = match fs::symlink_metadata(&target) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(output_error(&target)(e)),
            Ok(_) => {
                let aside = sibling(&target, "replaced")?;
                fs::rename(&target, &aside).map_err(output_error(&target))?;
                Some(aside)
            }
        };
        if let Err(e) = fs::rename(&self.dir, &target) {
            if let Some(aside) = &aside {
                // Put the old folder back; the new one stays in staging and
                // is removed on drop.
                let _ = fs::rename(aside, &target);
            }
            return Err(output_error(&target)(e));
        }
        self.committed = true;
        if let Some(aside) = aside {
            remove_any(&aside).map_err(output_error(&aside))?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "decisio-staging-{name}-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn commit_moves_files_into_place_and_drop_cleans_up() {
        let root = scratch("commit");
        let target = root.join("nested").join("out");
        let staging = Staging::new(&target, false).unwrap();
        fs::write(staging.dir().join("a.txt"), "a").unwrap();
        staging.commit().unwrap();
        assert_eq!(fs::read_to_string(target.join("a.txt")).unwrap(), "a");

        // occupied: refused without force, nothing left behind
        let err = Staging::new(&target, false).err().unwrap();
        assert!(matches!(err, ConvertError::OutputExists { .. }), "{err}");

        // dropped without commit: staging removed, target untouched
        let staging = Staging::new(&target, true).unwrap();
        fs::write(staging.dir().join("b.txt"), "b").unwrap();
        drop(staging);
        assert!(target.join("a.txt").exists());

        // forced: replaced wholesale
        let staging = Staging::new(&target, true).unwrap();
        fs::write(staging.dir().join("b.txt"), "b").unwrap();
        staging.commit().unwrap();
        assert!(!target.join("a.txt").exists());
        assert!(target.join("b.txt").exists());

        let leftovers: Vec<_> = fs::read_dir(root.join("nested"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, ["out"]);
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn an_empty_folder_is_not_occupied() {
        let root = scratch("empty");
        let target = root.join("out");
        fs::create_dir(&target).unwrap();
        let staging = Staging::new(&target, false).unwrap();
        fs::write(staging.dir().join("a.txt"), "a").unwrap();
        staging.commit().unwrap();
        assert!(target.join("a.txt").exists());
        fs::remove_dir_all(root).unwrap();
    }
}
